#!/bin/bash
# Diagnostic: what bounds the consumer rows (132 QPs doorbell/32, 264 warps). One build, knobs by environment.
set -u
cd "$(dirname "$0")"
O=$OUT/d; mkdir -p $O
S=$SECONDS
P=./post_rate
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $*" > $O/$name.txt; env "$@" timeout 60 $P $ARGS >> $O/$name.txt 2>&1; grep -E "doorbell/32|Warp 264|Warp 262|passed" $O/$name.txt | grep -v NIC; }
ARGS=""
run a_default X=1
run b_nomirror GDAKI_DIAG_NO_MIRROR=1
run c_watch2us GDAKI_DIAG_WATCH_PAUSE_NS=2000
run d_pass50us GDAKI_DIAG_PASS_PAUSE_US=50
ARGS="--qps 131"
run e_qps131 X=1
ARGS="--qps 131 --no-consumer"
run f_qps131_none X=1
ARGS=""
run g_default X=1
ARGS="--no-consumer"
run h_none X=1
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/d.tar.xz -C $OUT d && rm -rf $O
