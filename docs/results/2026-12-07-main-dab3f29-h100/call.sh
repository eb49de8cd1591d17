#!/bin/bash
# L = main at dab3f29 (18449a0 plus a new test, pingpong_bad_input's gpu_a_rank_killed_mid_run_ends_its_peers_run_with_errors)
# (2026-12-07, thirty-eighth session). First, on a machine with no PTX compiled yet: porttest's
# gpu_a_peer_that_leaves_ends_the_wait_for_it and coll's gpu_broadcast_root_learns_that_a_rank_left (both fixed
# in 582ca0e, not yet run on a GPU), with GPU-memory queues, then the departure test with host-memory queues.
# Then rank 1 of a two-process GPU ping-pong killed mid-run, then main's code as in earlier leases: every GPU
# test with both placements, ping-pong, post_rate --no-consumer, port_channel in every mode, memcheck.
set -u
START=$SECONDS; CUT=${CUT:-560}
D=/tmp/gkL; [ -d $D/b/N ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryL.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
GDAKI_QUEUES=gpu timeout 120 $D/tN/porttest --ignored --test-threads=1 gpu_a_peer --nocapture > $O/leave_gpu.txt 2>&1; echo "rc=$?" >> $O/leave_gpu.txt; stamp leave gpu
GDAKI_QUEUES=gpu timeout 60 $D/tN/coll --ignored --test-threads=1 gpu_broadcast_root_learns --nocapture > $O/coll_left_gpu.txt 2>&1; echo "rc=$?" >> $O/coll_left_gpu.txt; stamp coll left gpu
GDAKI_QUEUES=host timeout 60 $D/tN/porttest --ignored --test-threads=1 gpu_a_peer --nocapture > $O/leave_host.txt 2>&1; echo "rc=$?" >> $O/leave_host.txt; stamp leave host
GDAKI_QUEUES=host timeout 60 $D/tN/coll --ignored --test-threads=1 gpu_broadcast_root_learns --nocapture > $O/coll_left_host.txt 2>&1; echo "rc=$?" >> $O/coll_left_host.txt; stamp coll left host
timeout 120 $N/pingpong --executor gpu --iters 100 > $O/warm.txt 2>&1; stamp warm
GDAKI_PINGPONG=$N/pingpong timeout 150 $D/tN/pingpong_bad_input --ignored --test-threads=1 gpu_a_rank_killed --nocapture > $O/killed.txt 2>&1; echo "rc=$?" >> $O/killed.txt; stamp killed
timeout 90 $N/floors > $O/floors.txt 2>&1; stamp floors
for q in host gpu; do
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1
  stamp pp $q
done
for q in gpu host; do
  for t in porttest channel_host pingpong postrate faults launch coll; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
l=$(left); [ $l -gt 20 ] && { timeout $l $D/tN/cuda --ignored --test-threads=1 > $O/tests_cuda.txt 2>&1; echo "rc=$?" >> $O/tests_cuda.txt; stamp cuda; }
l=$(left); [ $l -gt 60 ] && { timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu.txt 2>&1; echo "rc=$?" >> $O/none_gpu.txt; stamp none; }
l=$(left); [ $l -gt 60 ] && { timeout 60 $N/port_channel --executor gpu --mode host,host-no-atomic,exclusive,warp,block,device --iters 50 --max-size 1048576 > $O/port_all.txt 2>&1; echo "rc=$?" >> $O/port_all.txt; stamp port; }
l=$(left); [ $l -gt 60 ] && { timeout $((l-10)) compute-sanitizer --tool memcheck $N/port_channel --executor gpu --mode host,exclusive --iters 4 --max-size 4096 > $O/san_port_memcheck.txt 2>&1; echo "rc=$?" >> $O/san_port_memcheck.txt; stamp san; }
grep -h "^test \|rc=\|panicked\|ended after\|ended .* after the kill" $O/leave_*.txt $O/coll_left_*.txt $O/killed.txt | cut -c1-300
grep "flag round" $O/floors.txt
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(tail -1 $f)"; done
grep -h "test result\|skipped\|rc=[1-9]" $O/tests_*.txt | sort | uniq -c
tail -2 $O/port_all.txt $O/san_port_memcheck.txt 2>/dev/null
stamp end
