#!/bin/bash
# G = main at 171328d (2026-12-06, thirty-sixth session): porttest's gpu_a_peer_that_leaves_ends_the_wait_for_it
# (rank 0 calls Communicator::leave, keeping its objects until rank 1's run ended; rank 1's GPU ping-pong wait
# must end with PeerGone naming rank 0 within 4 s), with both queue placements, then porttest's other GPU tests.
set -u
D=/tmp/gkG; [ -d $D/tN ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryG.tar.xz -C $D; }
O=$OUT; mkdir -p $O
nvidia-smi > $O/00-gpu.txt 2>&1
for q in gpu host; do
  GDAKI_QUEUES=$q timeout 120 $D/tN/porttest --ignored --test-threads=1 --nocapture gpu_a_peer > $O/leave_$q.txt 2>&1; echo "rc=$?" >> $O/leave_$q.txt
done
GDAKI_QUEUES=gpu timeout 250 $D/tN/porttest --ignored --test-threads=1 > $O/porttest_gpu.txt 2>&1; echo "rc=$?" >> $O/porttest_gpu.txt
grep -h "^test \|test result\|rc=\|panicked" $O/*.txt
