#!/bin/bash
# One lease call: every emulated-NIC benchmark of main's post path at befbd42 (Z, the library of main's head) in one run, both queue placements, the warp floor, the 4-QP 64 KiB row ten times (the
# floors first and last; post_rate with and without a consumer; ping-pong by doorbell and BlueFlame twice;
# gdaki-perf bw --one-nic), then Z's GPU tests not run on the H200 yet, both placements. Packed into $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-420}
D=/tmp/gkZ; [ -d $D/b/N ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryZ.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 60 $N/floors > $O/floors1.txt 2>&1; stamp floors1
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
  timeout 60 $N/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats --queues $q > $O/bw_$q.txt 2>&1; echo "rc=$?" >> $O/bw_$q.txt
  stamp bw $q
done
timeout 60 $N/floors > $O/floors2.txt 2>&1; stamp floors2
timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu_2.txt 2>&1; echo "rc=$?" >> $O/none_gpu_2.txt; stamp none gpu 2
for i in 1 2 3 4 5 6 7 8 9 10; do
  timeout 30 $N/gdaki-perf bw --one-nic --mode exclusive,block,device -s 262144 --nic-stats --queues gpu > $O/bw64k_$i.txt 2>&1; echo "rc=$?" >> $O/bw64k_$i.txt
  stamp bw64k $i
done
for q in gpu host; do
  for t in postrate porttest cuda channel_host; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
stamp end
