#!/bin/bash
# F = main at d684106 plus porttest's gpu_a_peer_that_leaves_ends_the_wait_for_it (2026-12-06, thirty-fifth
# session): rank 0 leaves the session without launching, rank 1's GPU ping-pong wait must end with PeerGone
# naming it within 4 s, in every Device-mode sharing; with both queue placements; then porttest's other GPU tests.
set -u
D=/tmp/gkF; [ -d $D/tN ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryF.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
nvidia-smi > $O/00-gpu.txt 2>&1
for q in gpu host; do
  GDAKI_QUEUES=$q timeout 120 $D/tN/porttest --ignored --test-threads=1 gpu_a_peer > $O/leave_$q.txt 2>&1; echo "rc=$?" >> $O/leave_$q.txt
done
GDAKI_QUEUES=gpu timeout 200 $D/tN/porttest --ignored --test-threads=1 > $O/porttest_gpu.txt 2>&1; echo "rc=$?" >> $O/porttest_gpu.txt
grep -h "test \|test result\|rc=\|panicked" $O/*.txt
