#!/bin/bash
# One lease call (CUT seconds): post_rate --no-consumer of f8bbadc (B) and main (M) in the order ORDER, ping-pong
# of B and M, ncu of M's one-thread and warp kernels, M's gdaki-perf bw (both placements), then M's GPU tests
# with GPU-memory then host-memory queues. Everything goes to /tmp/res and is packed into $OUT/all.tar after
# each step: the reply returns eight files at most.
set -u
START=$SECONDS; CUT=${CUT:-380}
D=/tmp/gk; [ -d $D/b/M ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carry.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
n=0
for v in ${ORDER:-B M M B}; do
  [ $(left) -lt 60 ] && break
  n=$((n+1))
  timeout 45 $D/b/$v/post_rate --executor gpu --no-consumer > $O/none_${n}_$v.txt 2>&1; echo "rc=$?" >> $O/none_${n}_$v.txt
  stamp none $n $v
done
for v in B M; do
  for m in db bf; do
    [ $(left) -lt 30 ] && continue
    f=; [ $m = bf ] && f=--blueflame
    timeout 30 $D/b/$v/pingpong --executor gpu --iters 3000 $f > $O/pp_${v}_$m.txt 2>&1; stamp pp $v $m
  done
done
if [ $(left) -gt 100 ]; then
  timeout 90 ncu --clock-control none --metrics smsp__inst_executed.sum --csv -k 'regex:gdaki_post_rate_(exclusive|blueflame|warp)' \
    $D/b/M/post_rate --executor gpu --no-consumer > $O/ncu_M.csv 2> $O/ncu_M_err.txt; echo "rc=$?" >> $O/ncu_M_err.txt
  xz -9 $O/ncu_M.csv; stamp ncu M
fi
for q in gpu host; do
  [ $(left) -lt 60 ] && continue
  timeout 60 $D/b/M/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats --queues $q > $O/bw_M_$q.txt 2>&1; echo "rc=$?" >> $O/bw_M_$q.txt
  stamp bw $q
done
for q in gpu host; do
  for t in postrate pingpong porttest faults cuda coll launch floors channel_host cuda_probe; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tM/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
stamp end
