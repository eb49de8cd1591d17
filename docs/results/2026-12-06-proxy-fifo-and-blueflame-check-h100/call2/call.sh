#!/bin/bash
# Host-mode ping-pong (gdaki-perf pingpong --one-nic, GPU-memory queues): H = 4f39d3a (FIFO push by CAS, first
# guess the cached tail), F = H + first guess head as loaded, Z = befbd42 (push by atomic add); alternated.
set -u
START=$SECONDS
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
for v in H Z F; do D=/tmp/gk$v; rm -rf $D; mkdir -p $D; tar -xJf carry/carry$v.tar.xz -C $D; done
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for v in H Z F; do timeout 60 /tmp/gk$v/b/N/gdaki-perf pingpong --one-nic --mode host -n 100 > $O/warm_$v.txt 2>&1; stamp warm $v; done
for i in 1 2 3 4; do
  for v in F H Z; do
    timeout 60 /tmp/gk$v/b/N/gdaki-perf pingpong --one-nic --mode host,host-no-atomic,exclusive > $O/hz_${v}_$i.txt 2>&1; echo "rc=$?" >> $O/hz_${v}_$i.txt
    stamp hz $v $i
  done
done
stamp end
