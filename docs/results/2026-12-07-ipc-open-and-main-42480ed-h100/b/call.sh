#!/bin/bash
# B = main at 42480ed, the second call (2026-12-07, forty-sixth session): every GPU test with both queue
# placements (first use of the PTX pays the JIT), the cuda tests, the two-process runs with the IPC path off and
# on once more, single-process ping-pong and post_rate. $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-540}
D=/tmp/gkA; [ -d $D/tA ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryA.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/A; T=$D/tA
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
for q in gpu host; do
  for t in launch porttest pingpong channel_host coll faults postrate; do
    l=$(left); [ $l -lt 60 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout 200 $T/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
l=$(left); [ $l -gt 40 ] && { timeout 60 $T/cuda --ignored --test-threads=1 > $O/tests_cuda.txt 2>&1; echo "rc=$?" >> $O/tests_cuda.txt; stamp cuda; }
l=$(left); [ $l -gt 60 ] && { timeout 60 $N/floors > $O/floors.txt 2>&1; stamp floors; }
for q in gpu host; do
  l=$(left); [ $l -lt 30 ] && continue
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1; stamp pp $q
done
for ipc in 0 1; do
  l=$(left); [ $l -lt 70 ] && continue
  GDAKI_WIRE_IPC=$ipc timeout 60 $N/gdaki-perf bw --processes 2 --executor gpu --mode exclusive --nic-stats > $O/bw2_ipc${ipc}_3.txt 2>&1; echo "rc=$?" >> $O/bw2_ipc${ipc}_3.txt; stamp bw2 ipc$ipc 3
done
l=$(left); [ $l -gt 40 ] && { timeout 30 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu.txt 2>&1; echo "rc=$?" >> $O/none_gpu.txt; stamp none; }
stamp end
grep -i "H100\|H200" $O/00-gpu.txt | head -2; grep "flag round" $O/floors.txt
grep -h "test result\|skipped\|rc=[1-9]\|panicked\|FAILED" $O/*.txt | sort | uniq -c | head -40
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(tail -n 1 $f)"; done
