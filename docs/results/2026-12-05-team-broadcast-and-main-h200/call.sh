#!/bin/bash
# One lease call: gdaki-perf bw --one-nic of main (M) and of the lock-free team post (E) alternated, GPU-memory
# queues (M E E M), then E with host-memory queues, compute-sanitizer racecheck of E's Block and Device rows,
# and E's port-channel and collective GPU tests with both placements. Packed into $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-240}
D=/tmp/gk; [ -d $D/b/M ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carry.tar.xz -C $D; }
[ -d $D/b/E ] || tar -xJf carry/carryE.tar.xz -C $D
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
n=0
for v in M E E M; do
  n=$((n+1))
  timeout 60 $D/b/$v/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats --queues gpu > $O/bw_${n}_$v.txt 2>&1; echo "rc=$?" >> $O/bw_${n}_$v.txt
  stamp bw $n $v
done
timeout 60 $D/b/E/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats --queues host > $O/bw_host_E.txt 2>&1; echo "rc=$?" >> $O/bw_host_E.txt; stamp bw host E
for q in gpu host; do
  for t in porttest coll; do
    l=$(left); [ $l -lt 30 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tE/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
if grep -q H200 $O/00-gpu.txt; then
  # On the H200 of the README's comparison with DOCA GPUNetIO: main's post path and floors.
  for v in M B M; do
    [ $(left) -lt 60 ] && continue
    i=1; [ -e $O/none_${v}_1.txt ] && i=2
    timeout 60 $D/b/$v/post_rate --executor gpu --no-consumer > $O/none_${v}_$i.txt 2>&1; echo "rc=$?" >> $O/none_${v}_$i.txt; stamp none $v $i
  done
  [ $(left) -gt 60 ] && { timeout 45 $D/b/M/floors > $O/floors.txt 2>&1; stamp floors; }
  for m in db bf; do
    [ $(left) -lt 30 ] && continue
    f=; [ $m = bf ] && f=--blueflame
    timeout 30 $D/b/M/pingpong --executor gpu --iters 3000 $f > $O/pp_M_$m.txt 2>&1; stamp pp M $m
  done
  if [ $(left) -gt 100 ]; then
    timeout 90 ncu --clock-control none --metrics smsp__inst_executed.sum --csv -k 'regex:gdaki_post_rate_(exclusive|blueflame|warp|batch)' \
      $D/b/M/post_rate --executor gpu --no-consumer > $O/ncu_M.csv 2> $O/ncu_M_err.txt; echo "rc=$?" >> $O/ncu_M_err.txt
    xz -9 $O/ncu_M.csv; stamp ncu M
  fi
fi
l=$(left); [ $l -gt 30 ] && { timeout $((l-10)) compute-sanitizer --tool racecheck $D/b/E/gdaki-perf bw --one-nic --mode block,device -s 1024 -n 20 --queues gpu > $O/racecheck.txt 2>&1; echo "rc=$?" >> $O/racecheck.txt; stamp racecheck; }
stamp end
