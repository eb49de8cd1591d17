#!/bin/bash
# The wire's same-host path (CUDA IPC) against TCP, two processes on one GPU: gdaki-perf bandwidth and
# pingpong latency with GDAKI_WIRE_IPC=0 (TCP) and unset (IPC), twice each; the CUDA IPC probe; the GPU tests
# of the CUDA copier, ping-pong, port channels, collectives and launches. Packed into $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-540}
D=/tmp/gkA; [ -d $D/tA ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryA.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/A; T=$D/tA
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 100 $T/cuda_probe --ignored --nocapture --test-threads=1 cuda_ipc > $O/cuda_probe.txt 2>&1; echo "rc=$?" >> $O/cuda_probe.txt; stamp probe
timeout 30 $N/floors > $O/floors.txt 2>&1; stamp floors
round() {
  i=$1
  for ipc in 0 1; do
    l=$(left); [ $l -lt 60 ] && continue
    GDAKI_WIRE_IPC=$ipc timeout 90 $N/gdaki-perf bw --processes 2 --executor gpu --mode exclusive --nic-stats > $O/bw_ipc${ipc}_$i.txt 2>&1; echo "rc=$?" >> $O/bw_ipc${ipc}_$i.txt; stamp bw ipc$ipc $i
    l=$(left); [ $l -lt 40 ] && continue
    GDAKI_WIRE_IPC=$ipc timeout 60 $N/pingpong --processes 2 --executor gpu --all --iters 300 > $O/pp_ipc${ipc}_$i.txt 2>&1; echo "rc=$?" >> $O/pp_ipc${ipc}_$i.txt; stamp pp ipc$ipc $i
  done
}
round 1
timeout 90 $T/cuda --ignored --test-threads=1 > $O/t_cuda.txt 2>&1; echo "rc=$?" >> $O/t_cuda.txt; stamp cuda
round 2
for b in pingpong porttest coll launch; do
  l=$(left); [ $l -lt 100 ] && { echo "skipped $b" >> $O/skipped.txt; continue; }
  timeout 150 $T/$b --ignored --test-threads=1 > $O/t_$b.txt 2>&1; echo "rc=$?" >> $O/t_$b.txt; stamp $b
done
stamp end
head -12 $O/00-gpu.txt | grep -i "H100\|H200\|Driver"; grep -h "^|" $O/cuda_probe.txt
for f in $O/bw_*.txt; do echo "== $f"; grep -E "^ *[0-9]+ |WRITE pieces|rc=" $f | head -14; done
for f in $O/pp_*.txt; do echo "== $f"; grep -E "^ *[0-9]+ |passed|rc=" $f | head -14; done
grep -h "test result\|rc=[1-9]\|FAILED\|panicked" $O/t_*.txt | sort | uniq -c | head -20; cat $O/skipped.txt 2>/dev/null
