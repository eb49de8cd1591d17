#!/bin/bash
# E = main at b3b752a (2026-12-06, thirty-fifth session): PortChannel::read_packets watches the QP as wait does
# (d3ac4c3); timeouts name their QP; a late channel wait reads the peer's departed word (PeerGone), and so does the collectives root's acknowledgment wait. GPU tests with both
# placements, ping-pong, post_rate --no-consumer, port_channel in every mode, compute-sanitizer memcheck.
set -u
START=$SECONDS; CUT=${CUT:-560}
D=/tmp/gkE; [ -d $D/b/N ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carryE.tar.xz -C $D; }
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
N=$D/b/N
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
timeout 120 $N/pingpong --executor gpu --iters 100 > $O/warm.txt 2>&1; stamp warm
timeout 90 $N/floors > $O/floors.txt 2>&1; stamp floors
for q in host gpu; do
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 > $O/pp_${q}_db.txt 2>&1
  timeout 30 $N/pingpong --executor gpu --queues $q --iters 3000 --blueflame > $O/pp_${q}_bf.txt 2>&1
  timeout 60 $N/gdaki-perf pingpong --one-nic --mode exclusive --queues $q -s 8 > $O/perfpp_${q}.txt 2>&1; echo "rc=$?" >> $O/perfpp_${q}.txt
  stamp pp $q
done
for q in gpu host; do
  for t in porttest channel_host pingpong postrate faults launch coll; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_$q.txt; continue; }
    echo "== $t" >> $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout $l $D/tN/$t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_$q.txt
    stamp test $q $t
  done
done
l=$(left); [ $l -gt 20 ] && { timeout $l $D/tN/cuda --ignored --test-threads=1 > $O/tests_cuda.txt 2>&1; echo "rc=$?" >> $O/tests_cuda.txt; stamp cuda; }
for i in 1 2; do
  l=$(left); [ $l -gt 60 ] && { timeout 60 $N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_gpu_$i.txt 2>&1; echo "rc=$?" >> $O/none_gpu_$i.txt; stamp none $i; }
done
l=$(left); [ $l -gt 60 ] && { timeout 60 $N/port_channel --executor gpu --mode host,host-no-atomic,exclusive,warp,block,device --iters 50 --max-size 1048576 > $O/port_all.txt 2>&1; echo "rc=$?" >> $O/port_all.txt; stamp port; }
l=$(left); [ $l -gt 60 ] && { timeout $((l-10)) compute-sanitizer --tool memcheck $N/port_channel --executor gpu --mode host,exclusive --iters 4 --max-size 4096 > $O/san_port_memcheck.txt 2>&1; echo "rc=$?" >> $O/san_port_memcheck.txt; stamp san; }
# Dead-peer probe: rank 1 of a two-process port_channel is killed (SIGKILL) mid-run; how rank 0 ends, and when.
for k in 1 2; do
  l=$(left); [ $l -lt 40 ] && break
  ( timeout 35 $N/port_channel --executor gpu --processes 2 --mode exclusive,device --iters 200000 --max-size 1024 > $O/kill_$k.txt 2>&1; echo "rc=$?" >> $O/kill_$k.txt ) &
  sleep $((6 + 3 * k)); pkill -9 -f "port_channel.*--rank 1"; T0=$(date +%s%N); wait; echo "ended $(( ($(date +%s%N) - T0) / 1000000 )) ms after the kill" >> $O/kill_$k.txt
  stamp kill $k
done
grep "flag round" $O/floors.txt
for f in $O/pp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5}') | $(grep 'round trip split' $f | sed 's/.*clocks): //') | $(tail -1 $f)"; done
for f in $O/perfpp_*; do echo "$(basename $f): $(grep -E '^ +8 ' $f | awk '{print $5, $10}') | $(grep passed $f)"; done
grep -h "test result\|skipped\|rc=[1-9]" $O/tests_*.txt | sort | uniq -c
tail -2 $O/port_all.txt $O/san_port_memcheck.txt 2>/dev/null
grep -h "error\|ended" $O/kill_*.txt 2>/dev/null | cut -c1-300
stamp end
