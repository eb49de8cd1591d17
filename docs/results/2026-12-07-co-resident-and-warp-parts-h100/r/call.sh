#!/bin/bash
# R = main at dad9c50 (2026-12-07, forty-first session): after review fixes (a warp's parts by rank with votes
# that stop later parts after a failure; the proxy's stop deadline). New GPU tests (launch co-resident, the
# small-ring flood) and the small-ring flood under compute-sanitizer synccheck and memcheck; post_rate
# --no-consumer alternated with the binary of the session's start (b0fe510); ping-pong; every GPU test with
# both placements; port_channel in every mode.
set -u
START=$SECONDS; CUT=${CUT:-570}
D=/tmp/gkR; [ -d $D/b/R ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryR.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/R; T=$D/tR
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 200 $T/launch --ignored --test-threads=1 gpu_module_checks > $O/new_launch.txt 2>&1; echo "rc=$?" >> $O/new_launch.txt; stamp launch
timeout 120 $T/postrate --ignored --test-threads=1 --exact gpu_shared_qp_takes_full_warps_on_a_small_ring --nocapture > $O/new_small_ring.txt 2>&1; echo "rc=$?" >> $O/new_small_ring.txt; stamp small ring
for tool in synccheck memcheck; do
  timeout 120 compute-sanitizer --tool $tool $T/postrate --ignored --test-threads=1 --exact gpu_shared_qp_takes_full_warps_on_a_small_ring > $O/san_small_ring_$tool.txt 2>&1; echo "rc=$?" >> $O/san_small_ring_$tool.txt; stamp san $tool
done
timeout 120 $N/pingpong --executor gpu --iters 100 > $O/warm.txt 2>&1; stamp warm
timeout 60 $N/floors > $O/floors.txt 2>&1; stamp floors
for q in gpu host; do
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1
  stamp pp $q
done
for i in 1 2 3; do
  timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_now_$i.txt 2>&1; echo "rc=$?" >> $O/none_now_$i.txt
  timeout 60 $D/b/before/post_rate --executor gpu --queues gpu --no-consumer > $O/none_before_$i.txt 2>&1; echo "rc=$?" >> $O/none_before_$i.txt
  stamp none $i
done
for q in gpu host; do
  for t in launch postrate porttest pingpong channel_host coll faults; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $T/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
l=$(left); [ $l -gt 60 ] && { timeout 60 $N/port_channel --executor gpu --mode host,host-no-atomic,exclusive,warp,block,device --iters 50 --max-size 1048576 > $O/port_all.txt 2>&1; echo "rc=$?" >> $O/port_all.txt; stamp port; }
grep -h "test result\|panicked\|rc=\|ERROR SUMMARY" $O/new_*.txt $O/san_*.txt | cut -c1-300
grep "flag round" $O/floors.txt
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(tail -1 $f)"; done
grep -H "Device 132x32\|Warp 1 QP" $O/none_*.txt | cut -c1-160
grep -h "test result\|skipped\|rc=[1-9]" $O/tests_*.txt | sort | uniq -c
tail -2 $O/port_all.txt 2>/dev/null
stamp end
