#!/bin/bash
# Y = main at 7fab502: every GPU test binary with --ignored (the grid barrier's BROKEN bit and counter check first), then a ping-pong.
set -u
START=$SECONDS
D=/tmp/gkY; [ -d $D/tY ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryY.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
T=$D/tY; N=$D/bY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
stamp start
for b in launch porttest pingpong channel_device coll faults; do
  left=$((330 - (SECONDS-START))); [ $left -lt 20 ] && { echo "skipped $b" >> $O/skipped.txt; continue; }
  lim=$(( left < 200 ? left : 200 ))
  timeout $lim $T/$b --ignored --test-threads=1 > $O/$b.txt 2>&1; echo "rc=$?" >> $O/$b.txt; stamp $b
done
left=$((360 - (SECONDS-START))); [ $left -gt 15 ] && { timeout $((left-5)) $N/pingpong --executor gpu --iters 3000 > $O/pp_db.txt 2>&1; stamp pp; }
cat $O/gpu.txt
grep -h "test result\|panicked\|rc=\|FAILED\|failed" $O/*.txt | cut -c1-200
grep -E "^ +8 " $O/pp_db.txt
cat $O/skipped.txt 2>/dev/null
stamp end
