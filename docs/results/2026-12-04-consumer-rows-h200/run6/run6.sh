#!/bin/bash
# Diagnostic: a consumer without the engine on the GPU (copy engines only, no mirrors).
set -u
cd "$(dirname "$0")"
O=$OUT/x; mkdir -p $O
S=$SECONDS
export GDAKI_DIAG_ROWS="doorbell,Warp 264"
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $* $ARGS" > $O/$name.txt; env "$@" timeout 100 ./post_rate $ARGS >> $O/$name.txt 2>&1; grep -E "^(Exclusive 132 QP\(s\), doorbell|Warp 264)|passed" $O/$name.txt; }
ARGS=""
run a_cons X=1
run b_cons_noengine GDAKI_DIAG_NO_ENGINE=1 GDAKI_DIAG_NO_MIRROR=1
run c_cons_noengine_pause GDAKI_DIAG_NO_ENGINE=1 GDAKI_DIAG_NO_MIRROR=1 GDAKI_DIAG_PASS_PAUSE_US=1000
ARGS="--no-consumer"
run d_none X=1
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/x.tar.xz -C $OUT x && rm -rf $O
