#!/bin/bash
# S = main at 4981bfa (2026-12-07): SharedQp::post in parts with bar.warp.sync barriers and
# part masks by rank. The small-ring flood (direct, synccheck, memcheck) and the postrate GPU suite, both placements.
set -u
START=$SECONDS
D=/tmp/gkS; [ -d $D/tS ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryS.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
T=$D/tS
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 200 $T/postrate --ignored --test-threads=1 --exact gpu_shared_qp_takes_full_warps_on_a_small_ring --nocapture > $O/small_ring.txt 2>&1; echo "rc=$?" >> $O/small_ring.txt; stamp small ring
for tool in synccheck memcheck; do
  timeout 120 compute-sanitizer --tool $tool $T/postrate --ignored --test-threads=1 --exact gpu_shared_qp_takes_full_warps_on_a_small_ring > $O/san_$tool.txt 2>&1; echo "rc=$?" >> $O/san_$tool.txt; stamp san $tool
done
for q in gpu host; do
  GDAKI_QUEUES=$q timeout 150 $T/postrate --ignored --test-threads=1 > $O/suite_$q.txt 2>&1; echo "rc=$?" >> $O/suite_$q.txt; stamp suite $q
done
grep -h "test \|test result\|panicked\|rc=\|ERROR SUMMARY\|posters x\|device code" $O/*.txt | cut -c1-250
stamp end
