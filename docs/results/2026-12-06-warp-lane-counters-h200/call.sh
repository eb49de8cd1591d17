#!/bin/bash
# The warp post with every lane's copy of the counters (M, exp-mirror) against befbd42 (Z, main's post path):
# post_rate --no-consumer alternated Z M M Z Z M M Z, M with host-memory queues and with a consumer, ncu of both
# builds' warp kernels; then M's GPU tests (post rate, port channels, faults, cuda) and main's tests not run
# since their device code last changed (T: coll, pingpong, launch, floors, cuda_probe), both placements.
set -u
START=$SECONDS; CUT=${CUT:-560}
for b in Z M T; do D=/tmp/gk$b; [ -d $D/tN ] || { rm -rf $D; mkdir -p $D; tar -xJf carry/carry$b.tar.xz -C $D; }; done
O=/tmp/res; rm -rf $O; mkdir -p $O
stamp() { echo "$(date -u +%T) +$((SECONDS-START))s $*" >> $O/stamps.txt; tar -cf ${OUT:-/tmp}/all.tar -C $O .; }
left() { echo $((CUT - (SECONDS-START))); }
nvidia-smi > $O/00-gpu.txt 2>&1
stamp start
n=0
for b in Z M M Z Z M M Z; do
  n=$((n+1))
  timeout 90 /tmp/gk$b/b/N/post_rate --executor gpu --queues gpu --no-consumer > $O/none_${n}_$b.txt 2>&1; echo "rc=$?" >> $O/none_${n}_$b.txt; stamp none $n $b
done
for b in M Z; do
  timeout 60 /tmp/gk$b/b/N/post_rate --executor gpu --queues host --no-consumer > $O/none_host_$b.txt 2>&1; echo "rc=$?" >> $O/none_host_$b.txt; stamp none host $b
  timeout 60 /tmp/gk$b/b/N/post_rate --executor gpu --queues gpu > $O/cons_gpu_$b.txt 2>&1; echo "rc=$?" >> $O/cons_gpu_$b.txt; stamp cons gpu $b
done
for b in Z M; do
  timeout 90 ncu --clock-control none --metrics smsp__inst_executed.sum --csv -k 'regex:gdaki_post_rate_(warp|exclusive)' \
    /tmp/gk$b/b/N/post_rate --executor gpu --no-consumer > $O/ncu_$b.csv 2> $O/ncu_${b}_err.txt; echo "rc=$?" >> $O/ncu_${b}_err.txt
  xz -9 $O/ncu_$b.csv; stamp ncu $b
done
run_tests() { # build, placement, tests...
  local b=$1 q=$2; shift 2
  for t in "$@"; do
    l=$(left); [ $l -lt 20 ] && { echo "skipped $t" >> $O/tests_${b}_$q.txt; continue; }
    echo "== $t" >> $O/tests_${b}_$q.txt
    GDAKI_QUEUES=$q timeout $l /tmp/gk$b/tN/$t --ignored --test-threads=1 >> $O/tests_${b}_$q.txt 2>&1; echo "== $t rc=$?" >> $O/tests_${b}_$q.txt
    stamp test $b $q $t
  done
}
run_tests M gpu postrate porttest channel_host faults cuda
run_tests M host postrate porttest channel_host
run_tests T gpu coll pingpong launch floors cuda_probe
run_tests T host coll pingpong launch floors cuda_probe
stamp end
