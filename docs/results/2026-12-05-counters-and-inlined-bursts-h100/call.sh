#!/bin/bash
# One lease call: post_rate --no-consumer of six builds interleaved twice, B's floors, ping-pong of B and U,
# ncu of V's one-thread and warp kernels, then U's GPU tests, all inside ${CUT}s.
set -u
START=$SECONDS; CUT=${CUT:-380}
D=/tmp/gk; rm -rf $D; mkdir -p $D; tar -xJf carry/carry.tar.xz -C $D
O=${OUT:-/tmp/out}; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for v in B V A U T R R T U A V B; do
  [ $(left) -lt 60 ] && break
  i=1; [ -e $O/none_${v}_1.txt ] && i=2
  timeout 45 $D/b/$v/post_rate --executor gpu --no-consumer > $O/none_${v}_$i.txt 2>&1; echo "rc=$?" >> $O/none_${v}_$i.txt
  stamp none $v $i
done
[ $(left) -gt 40 ] && { timeout 40 $D/b/B/floors > $O/floors.txt 2>&1; stamp floors; }
for v in B U; do
  for m in db bf; do
    [ $(left) -lt 30 ] && continue
    f=; [ $m = bf ] && f=--blueflame
    timeout 30 $D/b/$v/pingpong --executor gpu --iters 3000 $f > $O/pp_${v}_$m.txt 2>&1; stamp pp $v $m
  done
done
if [ $(left) -gt 100 ]; then
  timeout $(( $(left) - 20 )) ncu --clock-control none --metrics smsp__inst_executed.sum --csv -k 'regex:gdaki_post_rate_(exclusive|blueflame|warp)' \
    $D/b/V/post_rate --executor gpu --no-consumer > $O/ncu_V.csv 2> $O/ncu_V_err.txt; echo "rc=$?" >> $O/ncu_V_err.txt
  xz -9 $O/ncu_V.csv; stamp ncu V
fi
for t in postrate pingpong porttest faults cuda coll launch floors channel_host cuda_probe; do
  l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_gpu.txt; continue; }
  echo "== $t" >> $O/tests_gpu.txt
  GDAKI_QUEUES=gpu timeout $l $D/tU/$t --ignored --test-threads=1 >> $O/tests_gpu.txt 2>&1; echo "== $t rc=$?" >> $O/tests_gpu.txt
  stamp test $t
done
stamp end
