#!/bin/bash
# 924b194 (G): the emulated NIC's BlueFlame word-0 check, the FIFO push's first guess, post_raw's limit. The
# floors, ping-pong by doorbell and BlueFlame with both placements, post_rate with the NIC consuming (both
# placements: the BlueFlame rows' mismatch counter with host-memory queues), Host-mode ping-pong, GPU tests.
set -u
START=$SECONDS; CUT=${CUT:-380}
G=/tmp/gkG; rm -rf $G; mkdir -p $G; tar -xJf carry/carryG.tar.xz -C $G
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$G/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 90 $N/floors > $O/floors1.txt 2>&1; stamp floors1
for q in gpu host; do
  timeout 60 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1; stamp pp $q db
  timeout 60 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1; stamp pp $q bf
done
for q in gpu host; do
  timeout 60 $N/post_rate --executor gpu --queues $q > $O/cons_$q.txt 2>&1; echo "rc=$?" >> $O/cons_$q.txt; stamp cons $q
done
for i in 1 2; do
  timeout 90 $N/gdaki-perf pingpong --one-nic --mode host,host-no-atomic,exclusive > $O/hz_G_$i.txt 2>&1; echo "rc=$?" >> $O/hz_G_$i.txt; stamp hz $i
done
for q in gpu host; do
  for t in porttest channel_host pingpong postrate faults launch; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $G/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
stamp end
