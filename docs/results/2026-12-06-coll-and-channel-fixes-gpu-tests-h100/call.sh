#!/bin/bash
# e2f5c2b (C): GPU tests of what changed since the last GPU run: the collectives (all-to-all region checks),
# the port channels (wait's count given back, put_packets' checks), post rate; both placements.
set -u
START=$SECONDS; CUT=${CUT:-400}
C=/tmp/gkC; rm -rf $C; mkdir -p $C; tar -xJf carry/carryC.tar.xz -C $C
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for q in gpu host; do
  for t in coll porttest channel_host postrate; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $C/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
stamp end
