#!/bin/bash
set -u
START=$SECONDS
D=/tmp/ppx; [ -x $D/pp_V1 ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/ppx.tar.xz -C $D; }
O=/tmp/res2; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
for v in V0 V1; do timeout 100 $D/pp_$v --executor gpu --queues host --iters 300 > $O/warm_$v.txt 2>&1; echo "rc=$?" >> $O/warm_$v.txt; stamp warm $v; done
for i in 1 2; do
  for v in B V0 V1; do
    timeout 30 $D/pp_$v --executor gpu --queues host --iters 3000 > $O/host_db_${v}_$i.txt 2>&1; echo "rc=$?" >> $O/host_db_${v}_$i.txt; stamp $v $i
  done
done
for f in $O/warm_* $O/host_db_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(grep 'round trip split' $f | sed 's/.*clocks): //') | $(tail -2 $f | tr '\n' ' ')"; done
