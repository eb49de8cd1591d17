#!/bin/bash
# A = main at 42480ed (2026-12-07, forty-sixth session): the CUDA IPC probe (does cuIpcOpenMemHandle wait for a
# spinning kernel), two-process ping-pong and bandwidth with the same-host IPC path off and on (twice each, floors
# in the same run), every GPU test with both queue placements (the forty-fifth session's device error codes
# were only checked on the cpu executor), then the single-process benchmarks. $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-560}
D=/tmp/gkA; [ -d $D/tA ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryA.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/A; T=$D/tA
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 90 $T/cuda_probe --ignored --nocapture --test-threads=1 > $O/cuda_probe.txt 2>&1; echo "rc=$?" >> $O/cuda_probe.txt; stamp probe
timeout 60 $N/pingpong --executor gpu --iters 100 > $O/warm.txt 2>&1; stamp warm
for i in 1 2; do
  timeout 60 $N/floors > $O/floors$i.txt 2>&1; stamp floors $i
  for ipc in 0 1; do
    GDAKI_WIRE_IPC=$ipc timeout 90 $N/pingpong --processes 2 --executor gpu --all --iters 300 > $O/pp2_ipc${ipc}_$i.txt 2>&1; echo "rc=$?" >> $O/pp2_ipc${ipc}_$i.txt; stamp pp2 ipc$ipc $i
    GDAKI_WIRE_IPC=$ipc timeout 100 $N/gdaki-perf bw --processes 2 --executor gpu --mode exclusive --nic-stats > $O/bw2_ipc${ipc}_$i.txt 2>&1; echo "rc=$?" >> $O/bw2_ipc${ipc}_$i.txt; stamp bw2 ipc$ipc $i
  done
done
for q in gpu host; do
  for t in launch porttest pingpong channel_host coll faults postrate; do
    l=$(left); [ $l -lt 60 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout 150 $T/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
l=$(left); [ $l -gt 40 ] && { timeout 60 $T/cuda --ignored --test-threads=1 > $O/tests_cuda.txt 2>&1; echo "rc=$?" >> $O/tests_cuda.txt; stamp cuda; }
for q in gpu host; do
  l=$(left); [ $l -lt 30 ] && continue
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1; stamp pp $q
  l=$(left); [ $l -lt 30 ] && continue
  timeout 30 $N/post_rate --executor gpu --queues $q --no-consumer > $O/none_${q}.txt 2>&1; echo "rc=$?" >> $O/none_${q}.txt; stamp none $q
done
stamp end
grep -i "H100\|H200\|Driver Version" $O/00-gpu.txt | head -3; grep -h "^|" $O/cuda_probe.txt; grep "flag round" $O/floors*.txt
grep -h "test result\|skipped\|rc=[1-9]\|panicked" $O/*.txt | sort | uniq -c | head -30
for f in $O/pp2_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | head -1) | $(tail -2 $f | tr '\n' ' ')"; done
