#!/bin/bash
# One lease call at main's head (X): the GPU tests with both placements (the port tests first: Warp sharing is new
# there), post_rate --no-consumer (the warp loop changed by one instruction), gdaki-perf bw with Warp rows.
set -u
START=$SECONDS; CUT=${CUT:-420}
D=/tmp/gkX; [ -d $D/b/N ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryX.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for q in gpu host; do
  for t in porttest postrate pingpong faults cuda coll launch floors channel_host cuda_probe; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu.txt 2>&1; echo "rc=$?" >> $O/none_gpu.txt; stamp none
timeout 90 $N/gdaki-perf bw --one-nic --mode exclusive,warp,block,device --nic-stats --queues gpu > $O/bw_gpu.txt 2>&1; echo "rc=$?" >> $O/bw_gpu.txt; stamp bw
stamp end
