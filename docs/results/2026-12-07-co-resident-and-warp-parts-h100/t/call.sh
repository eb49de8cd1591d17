#!/bin/bash
# T = main at 9821cba, the engine exit fix (2026-12-07): synccheck on the small-ring flood and on the ping-pong, then
# the postrate, porttest and pingpong GPU suites, ping-pong runs and port_channel in every mode.
set -u
START=$SECONDS
D=/tmp/gkT; [ -d $D/tT ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryT.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
T=$D/tT; N=$D/bT
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 200 compute-sanitizer --tool synccheck $T/postrate --ignored --test-threads=1 --exact gpu_shared_qp_takes_full_warps_on_a_small_ring > $O/san_sync_small_ring.txt 2>&1; echo "rc=$?" >> $O/san_sync_small_ring.txt; stamp san small ring
timeout 120 compute-sanitizer --tool synccheck $N/pingpong --executor gpu --iters 200 > $O/san_sync_pingpong.txt 2>&1; echo "rc=$?" >> $O/san_sync_pingpong.txt; stamp san pingpong
for q in gpu host; do
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1
  stamp pp $q
done
for t in postrate porttest pingpong; do
  echo "== $t" >> $O/tests_gpu.txt
  GDAKI_QUEUES=gpu timeout 120 $T/$t --ignored --test-threads=1 >> $O/tests_gpu.txt 2>&1; echo "== $t rc=$?" >> $O/tests_gpu.txt
  stamp test $t
done
timeout 60 $N/port_channel --executor gpu --mode host,host-no-atomic,exclusive,warp,block,device --iters 50 --max-size 1048576 > $O/port_all.txt 2>&1; echo "rc=$?" >> $O/port_all.txt; stamp port
grep -h "test result\|panicked\|rc=\|ERROR SUMMARY\|Barrier" $O/san_*.txt | sort | uniq -c | cut -c1-250
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(tail -1 $f)"; done
grep -h "test result\|rc=[1-9]" $O/tests_*.txt | sort | uniq -c
tail -2 $O/port_all.txt
stamp end
