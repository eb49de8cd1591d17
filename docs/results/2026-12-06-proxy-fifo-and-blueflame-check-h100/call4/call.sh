#!/bin/bash
# 51bb826 (K): the saturating Dim3::count and #[kernel]'s name handling in device code; the GPU tests of the
# launch, the port channels, the collectives, ping-pong, the CUDA layer, the proxy and the fault catalogue,
# GPU-memory queues (and host-memory queues as time allows), and one ping-pong of each kind.
set -u
START=$SECONDS; CUT=${CUT:-300}
K=/tmp/gkK; rm -rf $K; mkdir -p $K; tar -xJf carry/carryK.tar.xz -C $K
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for q in gpu host; do
  for t in launch porttest coll pingpong channel_host faults cuda; do
    [ $q = host ] && [ $t = cuda ] && continue
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $K/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
for q in gpu host; do
  timeout 60 $K/b/N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1; stamp pp $q db
  timeout 60 $K/b/N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1; stamp pp $q bf
done
stamp end
