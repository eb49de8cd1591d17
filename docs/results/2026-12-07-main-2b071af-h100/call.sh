#!/bin/bash
# N = main at 2b071af (2026-12-07, fortieth session): since the last GPU run (dab3f29) the proxy's released-QP
# count, the bootstrap root's rejoin, a Warp-sharing team wider than a warp refused, SharedQp::post's lanes aggregated per WQE size (tested
# first, with the binary before the fix as well), test fixes. Floors, ping-pong
# (both placements, doorbell and BlueFlame), post_rate --no-consumer, gdaki-perf bw --one-nic (GPU-memory
# queues), every GPU test with both placements, port_channel in every mode, memcheck.
set -u
START=$SECONDS; CUT=${CUT:-560}
D=/tmp/gkN; [ -d $D/b/N ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryN.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 120 $N/pingpong --executor gpu --iters 100 > $O/warm.txt 2>&1; stamp warm
for q in gpu host; do
  GDAKI_QUEUES=$q timeout 90 $D/tN/postrate --ignored --test-threads=1 --exact gpu_shared_qp_takes_wqes_of_two_sizes_from_one_warp --nocapture > $O/mixed_$q.txt 2>&1; echo "rc=$?" >> $O/mixed_$q.txt; stamp mixed $q
done
GDAKI_QUEUES=gpu timeout 90 $D/tN/postrate_before --ignored --test-threads=1 --exact gpu_shared_qp_takes_wqes_of_two_sizes_from_one_warp --nocapture > $O/mixed_before.txt 2>&1; echo "rc=$?" >> $O/mixed_before.txt; stamp mixed before
timeout 90 $N/floors > $O/floors.txt 2>&1; stamp floors
for q in gpu host; do
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1
  stamp pp $q
done
timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu.txt 2>&1; echo "rc=$?" >> $O/none_gpu.txt; stamp none
timeout 60 $N/gdaki-perf pingpong --one-nic --mode host,exclusive > $O/perf_pp.txt 2>&1; echo "rc=$?" >> $O/perf_pp.txt; stamp perf pp
timeout 60 $N/gdaki-perf packet --one-nic --mode host,exclusive > $O/perf_ll.txt 2>&1; echo "rc=$?" >> $O/perf_ll.txt; stamp perf ll
timeout 60 $N/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats --queues gpu > $O/bw_gpu.txt 2>&1; echo "rc=$?" >> $O/bw_gpu.txt; stamp bw
for q in gpu host; do
  for t in porttest channel_host pingpong postrate faults launch coll; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
l=$(left); [ $l -gt 20 ] && { timeout $l $D/tN/cuda --ignored --test-threads=1 > $O/tests_cuda.txt 2>&1; echo "rc=$?" >> $O/tests_cuda.txt; stamp cuda; }
l=$(left); [ $l -gt 60 ] && { timeout 60 $N/port_channel --executor gpu --mode host,host-no-atomic,exclusive,warp,block,device --iters 50 --max-size 1048576 > $O/port_all.txt 2>&1; echo "rc=$?" >> $O/port_all.txt; stamp port; }
l=$(left); [ $l -gt 60 ] && { timeout $((l-10)) compute-sanitizer --tool memcheck $N/port_channel --executor gpu --mode host,exclusive --iters 4 --max-size 4096 > $O/san_port_memcheck.txt 2>&1; echo "rc=$?" >> $O/san_port_memcheck.txt; stamp san; }
grep -h "test result\|panicked\|rc=\|posters x" $O/mixed_*.txt | cut -c1-300
grep "flag round" $O/floors.txt
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(tail -1 $f)"; done
grep -E "^ +1024 +1 " $O/bw_gpu.txt
grep -h "target" $O/perf_pp.txt $O/perf_ll.txt
grep -h "test result\|skipped\|rc=[1-9]" $O/tests_*.txt | sort | uniq -c
tail -2 $O/port_all.txt $O/san_port_memcheck.txt 2>/dev/null
stamp end
