#!/bin/bash
# 4f39d3a (H): the proxy fixes (FIFO push by CAS with room, flush retried past the proxy timeout, HostNoAtomic
# counts per semaphore, channel ids given back) and default_chunk rounded up. GPU tests of both placements, the
# floors, ping-pong and post rate, and Host-mode ping-pong against befbd42 (Z: FIFO push by atomic add), alternated.
set -u
START=$SECONDS; CUT=${CUT:-480}
H=/tmp/gkH; rm -rf $H; mkdir -p $H; tar -xJf carry/carryH.tar.xz -C $H
Z=/tmp/gkZ; rm -rf $Z; mkdir -p $Z; tar -xJf carry/carryZ.tar.xz -C $Z
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$H/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 60 $N/floors > $O/floors1.txt 2>&1; stamp floors1
for q in gpu host; do
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1; stamp pp $q db
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1; stamp pp $q bf
done
timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu.txt 2>&1; echo "rc=$?" >> $O/none_gpu.txt; stamp none gpu
timeout 60 $Z/b/N/gdaki-perf pingpong --one-nic --mode host -n 100 > $O/hz_warm_Z.txt 2>&1; stamp warm Z
timeout 60 $N/gdaki-perf pingpong --one-nic --mode host -n 100 > $O/hz_warm_H.txt 2>&1; stamp warm H
for i in 1 2 3; do
  for v in H Z; do
    B=$H/b/N; [ $v = Z ] && B=$Z/b/N
    timeout 60 $B/gdaki-perf pingpong --one-nic --mode host,host-no-atomic,exclusive > $O/hz_${v}_$i.txt 2>&1; echo "rc=$?" >> $O/hz_${v}_$i.txt
    stamp hz $v $i
  done
done
for q in gpu host; do
  for t in channel_host porttest coll postrate pingpong launch floors faults cuda cuda_probe; do
    [ $q = host ] && case $t in cuda|cuda_probe|floors) continue;; esac
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $H/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
timeout 60 $N/floors > $O/floors2.txt 2>&1; stamp floors2
stamp end
