#!/bin/bash
# A = d601c40 (waits look at the CQ from their first try), C = 8fc7d38 (only once the signal is late),
# D = 9347eee (while a CQE of the waiter's own work is due, else once late). Alternated ping-pongs, then D's GPU tests.
set -u
START=$SECONDS; CUT=${CUT:-540}
for v in A D; do D=/tmp/gk$v; [ -d $D/b/N ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carry$v.tar.xz -C $D; }; done
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for v in A D; do timeout 120 /tmp/gk$v/b/N/pingpong --executor gpu --iters 100 > $O/warm_$v.txt 2>&1; stamp warm $v; done
timeout 90 /tmp/gkD/b/N/floors > $O/floors.txt 2>&1; stamp floors
for i in 1 2; do
  for v in A D; do
    N=/tmp/gk$v/b/N
    for q in host gpu; do
      timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db_${v}_$i.txt 2>&1
      timeout 60 $N/gdaki-perf pingpong --one-nic --mode exclusive,block --queues $q -s 8 > $O/perfpp_${q}_${v}_$i.txt 2>&1; echo "rc=$?" >> $O/perfpp_${q}_${v}_$i.txt
    done
    stamp pp $v $i
  done
done
for q in gpu host; do
  for t in porttest channel_host pingpong faults coll; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l /tmp/gkD/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
grep "flag round" $O/floors.txt
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(grep 'round trip split' $f | sed 's/.*clocks): //') | $(tail -1 $f)"; done
for f in $O/perfpp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5, $10}' | tr '\n' ' ') | $(grep passed $f)"; done
grep -h "test result" $O/tests_*.txt | sort | uniq -c
stamp end
