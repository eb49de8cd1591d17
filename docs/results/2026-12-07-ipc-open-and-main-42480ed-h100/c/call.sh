#!/bin/bash
# Y = ca7936a with an experiment never committed: the CUDA copier's engine-warp limit for GPU-to-GPU copies
# from GDAKI_X_ENGINE_COPY_MAX (default 16 KiB). Two processes on one GPU, the IPC path on: bandwidth at three
# limits, then ping-pong (payloads checked with the new responder path). $OUT/all.tar after each step.
set -u
START=$SECONDS; CUT=${CUT:-330}
D=/tmp/gkY; rm -rf $D; mkdir -p $D; tar -xJf carry/carryY.tar.xz -C $D
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
GDAKI_WIRE_IPC=1 timeout 120 $D/gdaki-perf bw --processes 2 --executor gpu --mode exclusive -s 1024 > $O/warm.txt 2>&1; stamp warm
i=0
for run in "1 16384" "1 1048576" "1 4194304"; do
  set -- $run; i=$((i+1))
  l=$(left); [ $l -lt 45 ] && continue
  GDAKI_X_ENGINE_COPY_MAX=$2 GDAKI_WIRE_IPC=$1 timeout 45 $D/gdaki-perf bw --processes 2 --executor gpu --mode exclusive --nic-stats > $O/bw2_${i}_ipc$1_max$2.txt 2>&1; echo "rc=$?" >> $O/bw2_${i}_ipc$1_max$2.txt; stamp ipc$1 max$2
done
for m in 4194304 16384; do
  l=$(left); [ $l -lt 50 ] && continue
  GDAKI_X_ENGINE_COPY_MAX=$m GDAKI_WIRE_IPC=1 timeout 50 $D/pingpong --processes 2 --executor gpu --all --iters 100 > $O/pp2_ipc1_max$m.txt 2>&1; echo "rc=$?" >> $O/pp2_ipc1_max$m.txt; stamp pp2 max$m
done
stamp end
for f in $O/bw2_* $O/pp2_*; do echo "== $(basename $f)"; grep -E "^ +[0-9]" $f | awk '{print $1, $5}' | tr '\n' ';'; echo; tail -n 2 $f | tr '\n' ' '; echo; done
