#!/bin/bash
# befbd42 (Z: post_rate's one-round path) against main's head before it (Y, 18b9021's binaries): post_rate
# --no-consumer alternated Y Z Z Y Y Z, Z with host-memory queues and with a consumer (Y beside it), ncu of Z's
# one-thread kernels, then Z's GPU tests (port channels, proxy, faults, post rate, cuda) with both placements.
set -u
START=$SECONDS; CUT=${CUT:-500}
Y=/tmp/gkY; [ -d $Y/b/N ] || { rm -rf $Y; mkdir -p $Y; tar -xJf carry/carryY.tar.xz -C $Y; }
Z=/tmp/gkZ; [ -d $Z/b/N ] || { rm -rf $Z; mkdir -p $Z; tar -xJf carry/carryZ.tar.xz -C $Z; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
n=0
for b in Y Z Z Y Y Z; do
  n=$((n+1))
  timeout 60 /tmp/gk$b/b/N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_${n}_$b.txt 2>&1; echo "rc=$?" >> $O/none_${n}_$b.txt; stamp none $n $b
done
timeout 60 $Z/b/N/post_rate --executor gpu --queues host --no-consumer > $O/none_host_Z.txt 2>&1; echo "rc=$?" >> $O/none_host_Z.txt; stamp none host Z
for b in Y Z; do
  timeout 60 /tmp/gk$b/b/N/post_rate --executor gpu --queues gpu > $O/cons_gpu_$b.txt 2>&1; echo "rc=$?" >> $O/cons_gpu_$b.txt; stamp cons gpu $b
done
timeout 60 $Z/b/N/post_rate --executor gpu --queues host > $O/cons_host_Z.txt 2>&1; echo "rc=$?" >> $O/cons_host_Z.txt; stamp cons host Z
timeout 120 ncu --clock-control none --metrics smsp__inst_executed.sum --csv -k 'regex:gdaki_post_rate_(exclusive|blueflame|batch)' \
  $Z/b/N/post_rate --executor gpu --no-consumer > $O/ncu_Z.csv 2> $O/ncu_Z_err.txt; echo "rc=$?" >> $O/ncu_Z_err.txt
xz -9 $O/ncu_Z.csv; stamp ncu Z
for q in gpu host; do
  for t in postrate porttest channel_host faults cuda; do
    [ $q = host ] && [ $t = faults -o $t = cuda ] && continue
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $Z/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
stamp end
