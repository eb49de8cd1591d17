#!/bin/bash
# B = main's head (see the results doc for the commit): the CUDA IPC probe, the GPU tests of what changed
# (grid barrier, proxy, port channels, collectives, faults, ping-pong), then every emulated-NIC benchmark with
# both queue placements, twice. Packed into $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-480}
D=/tmp/gkB; [ -d $D/tB ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryB.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/B; T=$D/tB
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 120 $T/cuda_probe --ignored --nocapture --test-threads=1 > $O/cuda_probe.txt 2>&1; echo "rc=$?" >> $O/cuda_probe.txt; stamp probe
for b in launch porttest pingpong channel_host channel_device coll faults postrate; do
  l=$(left); [ $l -lt 200 ] && { echo "skipped $b" >> $O/skipped.txt; continue; }
  timeout 150 $T/$b --ignored --test-threads=1 > $O/t_$b.txt 2>&1; echo "rc=$?" >> $O/t_$b.txt; stamp $b
done
for i in 1 2; do
  timeout 60 $N/floors > $O/floors$i.txt 2>&1; stamp floors $i
  for q in gpu host; do
    timeout 60 $N/post_rate --executor gpu --queues $q --no-consumer > $O/none_${q}_$i.txt 2>&1; echo "rc=$?" >> $O/none_${q}_$i.txt; stamp none $q $i
    timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db_$i.txt 2>&1; stamp pp $q db $i
    timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf_$i.txt 2>&1; stamp pp $q bf $i
    l=$(left); [ $l -lt 40 ] && continue
    timeout 60 $N/gdaki-perf bw --one-nic --mode exclusive,block,device --nic-stats --queues $q > $O/bw_${q}_$i.txt 2>&1; echo "rc=$?" >> $O/bw_${q}_$i.txt; stamp bw $q $i
  done
  l=$(left); [ $l -lt 40 ] && continue
  timeout 60 $N/post_rate --executor gpu --queues gpu > $O/cons_gpu_$i.txt 2>&1; echo "rc=$?" >> $O/cons_gpu_$i.txt; stamp cons gpu $i
done
stamp end
head -10 $O/00-gpu.txt | grep -i "H100\|H200\|Driver"; grep -h "^|" $O/cuda_probe.txt; grep -h "test result\|rc=[1-9]\|FAILED\|panicked" $O/*.txt | sort | uniq -c | head -20; cat $O/skipped.txt 2>/dev/null
