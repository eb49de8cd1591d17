#!/bin/bash
# befbd42 (Z) on the H200 of the README's comparison with DOCA GPUNetIO: post_rate --no-consumer twice with
# GPU-memory queues and once with host-memory queues, ncu of its one-thread and warp kernels.
set -u
START=$SECONDS
Z=/tmp/gkZ; [ -d $Z/b/N ] || { rm -rf $Z; mkdir -p $Z; tar -xJf carry/carryZ.tar.xz -C $Z; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for i in 1 2; do
  timeout 60 $Z/b/N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu_$i.txt 2>&1; echo "rc=$?" >> $O/none_gpu_$i.txt; stamp none gpu $i
done
timeout 60 $Z/b/N/post_rate --executor gpu --queues host --no-consumer > $O/none_host.txt 2>&1; echo "rc=$?" >> $O/none_host.txt; stamp none host
timeout 150 ncu --clock-control none --metrics smsp__inst_executed.sum --csv -k 'regex:gdaki_post_rate_(exclusive|blueflame|batch|warp)' \
  $Z/b/N/post_rate --executor gpu --no-consumer > $O/ncu_Z.csv 2> $O/ncu_Z_err.txt; echo "rc=$?" >> $O/ncu_Z_err.txt
xz -9 $O/ncu_Z.csv; stamp ncu Z
stamp end
