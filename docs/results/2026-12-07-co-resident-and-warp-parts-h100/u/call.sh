#!/bin/bash
# U = main at 27dbeec (2026-12-07): the grid-wide barrier in a co-resident launch at the GPU's limit, and the
# launch tests, directly and under synccheck and memcheck.
set -u
START=$SECONDS
D=/tmp/gkU; [ -d $D/tU ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryU.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
T=$D/tU
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 240 $T/launch --ignored --test-threads=1 --nocapture > $O/launch.txt 2>&1; echo "rc=$?" >> $O/launch.txt; stamp launch
for tool in synccheck memcheck; do
  timeout 150 compute-sanitizer --tool $tool $T/launch --ignored --test-threads=1 --exact gpu_grid_barrier_orders_every_ctas_stores > $O/san_grid_$tool.txt 2>&1; echo "rc=$?" >> $O/san_grid_$tool.txt; stamp san $tool
done
grep -h "^test \|test result\|panicked\|rc=\|ERROR SUMMARY" $O/*.txt | cut -c1-250
stamp end
