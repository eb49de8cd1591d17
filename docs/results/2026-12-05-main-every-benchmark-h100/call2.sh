#!/bin/bash
# One lease call: every emulated-NIC benchmark of main (M) in one run, both queue placements: the platform
# floors first and last, post_rate with and without a consumer, ping-pong by doorbell and by BlueFlame twice,
# gdaki-perf bw --one-nic. Everything is packed into $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-300}
D=/tmp/gk; [ -d $D/b/M ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carry.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
M=$D/b/M
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 60 $M/floors > $O/floors1.txt 2>&1; stamp floors1
for q in gpu host; do
  timeout 60 $M/post_rate --executor gpu --queues $q --no-consumer > $O/none_$q.txt 2>&1; echo "rc=$?" >> $O/none_$q.txt; stamp none $q
  [ $(left) -lt 60 ] && continue
  timeout 60 $M/post_rate --executor gpu --queues $q > $O/cons_$q.txt 2>&1; echo "rc=$?" >> $O/cons_$q.txt; stamp cons $q
done
for q in gpu host; do
  for i in 1 2; do
    [ $(left) -lt 30 ] && continue
    timeout 30 $M/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db_$i.txt 2>&1; stamp pp $q db $i
    timeout 30 $M/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf_$i.txt 2>&1; stamp pp $q bf $i
  done
done
for q in gpu host; do
  [ $(left) -lt 40 ] && continue
  timeout 60 $M/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats --queues $q > $O/bw_$q.txt 2>&1; echo "rc=$?" >> $O/bw_$q.txt
  stamp bw $q
done
[ $(left) -gt 20 ] && { timeout 60 $M/floors > $O/floors2.txt 2>&1; stamp floors2; }
stamp end
