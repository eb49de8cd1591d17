#!/bin/bash
# d601c40 (A): main's post path and library (device code unchanged since befbd42 but for #[kernel]'s error
# paths). Every emulated-NIC benchmark in one run, both placements, then the GPU tests of both placements.
set -u
START=$SECONDS; CUT=${CUT:-540}
D=/tmp/gkA; [ -d $D/b/N ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryA.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 90 $N/floors > $O/floors1.txt 2>&1; stamp floors1
for q in gpu host; do
  timeout 60 $N/post_rate --executor gpu --queues $q --no-consumer > $O/none_$q.txt 2>&1; echo "rc=$?" >> $O/none_$q.txt; stamp none $q
  timeout 60 $N/post_rate --executor gpu --queues $q > $O/cons_$q.txt 2>&1; echo "rc=$?" >> $O/cons_$q.txt; stamp cons $q
done
for q in gpu host; do
  for i in 1 2; do
    timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db_$i.txt 2>&1; stamp pp $q db $i
    timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf_$i.txt 2>&1; stamp pp $q bf $i
  done
done
for q in gpu host; do
  timeout 60 $N/gdaki-perf bw --one-nic --mode exclusive,block,device --queues $q > $O/bw_$q.txt 2>&1; echo "rc=$?" >> $O/bw_$q.txt
  stamp bw $q
done
timeout 60 $N/floors > $O/floors2.txt 2>&1; stamp floors2
for q in gpu host; do
  for t in porttest channel_host pingpong postrate faults launch coll; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
l=$(left); [ $l -gt 30 ] && { timeout $l $D/tN/cuda --ignored --test-threads=1 > $O/tests_cuda.txt 2>&1; echo "rc=$?" >> $O/tests_cuda.txt; stamp cuda; }
stamp end
