#!/bin/bash
# Q = main at dbefb65 (2026-12-07, forty-first session): co-resident (cooperative) launches, a shared QP's warp
# batch over half the ring in parts, a team put over half the ring is Length. The new GPU tests first, then
# floors, ping-pong (both placements), post_rate --no-consumer beside the binary of the session's start
# (b0fe510), every GPU test with GPU-memory queues, port_channel in every mode.
set -u
START=$SECONDS; CUT=${CUT:-570}
D=/tmp/gkQ; [ -d $D/b/Q ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryQ.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/Q
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 60 $D/tQ/launch --ignored --test-threads=1 gpu_module_checks > $O/new_launch.txt 2>&1; echo "rc=$?" >> $O/new_launch.txt; stamp launch
timeout 120 $D/tQ/postrate --ignored --test-threads=1 --exact gpu_shared_qp_takes_full_warps_on_a_small_ring --nocapture > $O/new_small_ring.txt 2>&1; echo "rc=$?" >> $O/new_small_ring.txt; stamp small ring
timeout 120 $N/pingpong --executor gpu --iters 100 > $O/warm.txt 2>&1; stamp warm
timeout 90 $N/floors > $O/floors.txt 2>&1; stamp floors
for q in gpu host; do
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1
  stamp pp $q
done
for i in 1 2; do
  timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu_$i.txt 2>&1; echo "rc=$?" >> $O/none_gpu_$i.txt
  [ -x $D/b/before/post_rate ] && { timeout 60 $D/b/before/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu_before_$i.txt 2>&1; echo "rc=$?" >> $O/none_gpu_before_$i.txt; }
  stamp none $i
done
for t in launch postrate porttest pingpong channel_host channel_device emu_gpu faults coll; do
  l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_gpu.txt; continue; }
  echo "== $t" >> $O/tests_gpu.txt
  GDAKI_QUEUES=gpu timeout $l $D/tQ/$t --ignored --test-threads=1 >> $O/tests_gpu.txt 2>&1; echo "== $t rc=$?" >> $O/tests_gpu.txt
  stamp test $t
done
l=$(left); [ $l -gt 60 ] && { timeout 60 $N/port_channel --executor gpu --mode host,host-no-atomic,exclusive,warp,block,device --iters 50 --max-size 1048576 > $O/port_all.txt 2>&1; echo "rc=$?" >> $O/port_all.txt; stamp port; }
grep -h "test result\|panicked\|rc=" $O/new_*.txt | cut -c1-300
grep "flag round" $O/floors.txt
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(tail -1 $f)"; done
grep -h "shared by\|132 CTAs" $O/none_gpu*.txt | cut -c1-200
grep -h "test result\|skipped\|rc=[1-9]" $O/tests_*.txt | sort | uniq -c
tail -2 $O/port_all.txt 2>/dev/null
stamp end
