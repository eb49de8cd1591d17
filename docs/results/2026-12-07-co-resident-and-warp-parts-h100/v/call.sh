#!/bin/bash
# V = main at 27dbeec plus an experiment never committed: each Thread CTA barrier first waits for its warp's lanes (bar.warp.sync)
# (built uncommitted): synccheck on the grid barrier and the ping-pong, then the launch and porttest GPU tests and a ping-pong.
set -u
START=$SECONDS
D=/tmp/gkV; [ -d $D/tV ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryV.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
T=$D/tV; N=$D/bV
stamp start
timeout 150 compute-sanitizer --tool synccheck --print-limit 5 $T/launch --ignored --test-threads=1 --exact gpu_grid_barrier_orders_every_ctas_stores > $O/san_grid_sync.txt 2>&1; echo "rc=$?" >> $O/san_grid_sync.txt; stamp san grid
timeout 90 compute-sanitizer --tool synccheck --print-limit 5 $N/pingpong --executor gpu --iters 200 > $O/san_pp_sync.txt 2>&1; echo "rc=$?" >> $O/san_pp_sync.txt; stamp san pp
timeout 60 $N/pingpong --executor gpu --iters 3000 > $O/pp_db.txt 2>&1; stamp pp
timeout 90 $T/porttest --ignored --test-threads=1 > $O/porttest.txt 2>&1; echo "rc=$?" >> $O/porttest.txt; stamp porttest
grep -h "^test \|test result\|panicked\|rc=\|ERROR SUMMARY\|passed" $O/*.txt | cut -c1-200
grep -E "^ +8 " $O/pp_db.txt
stamp end
