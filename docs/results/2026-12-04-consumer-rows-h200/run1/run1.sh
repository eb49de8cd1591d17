#!/bin/bash
# Measurements: base (main before the mirror's limit) against new, alternating, one lease.
set -u
cd "$(dirname "$0")"
O=$OUT/r; mkdir -p $O
S=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv > $O/00-gpu.txt 2>&1
timeout 60 ./new/floors > $O/floors.txt 2>&1
for i in 1 2; do
  for v in base new; do
    echo "== $v cons $i ($((SECONDS-S)) s)"
    timeout 90 ./$v/post_rate > $O/cons_${v}$i.txt 2>&1
  done
done
for v in base new; do echo "== $v none ($((SECONDS-S)) s)"; timeout 90 ./$v/post_rate --no-consumer > $O/none_$v.txt 2>&1; done
for v in base new; do
  for bf in "" --blueflame; do
    echo "== $v pp $bf ($((SECONDS-S)) s)"
    echo "== $v $bf" >> $O/pp.txt; timeout 40 ./$v/pingpong --queues gpu $bf >> $O/pp.txt 2>&1
  done
done
for v in new base; do
  [ $((SECONDS-S)) -lt 380 ] || break
  echo "== $v bw ($((SECONDS-S)) s)"
  timeout 80 ./$v/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats > $O/bw_$v.txt 2>&1
done
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/r.tar.xz -C $OUT r && rm -rf $O
