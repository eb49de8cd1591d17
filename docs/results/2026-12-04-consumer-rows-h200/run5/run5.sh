#!/bin/bash
# Diagnostic: no consumer, rings posted at the same slots every launch (as post_rate does) or walking on from
# launch to launch (as with a consumer), against a consumer.
set -u
cd "$(dirname "$0")"
O=$OUT/w; mkdir -p $O
S=$SECONDS
export GDAKI_DIAG_ROWS="doorbell,Warp 264"
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $* $ARGS" > $O/$name.txt; env "$@" timeout 80 ./post_rate $ARGS >> $O/$name.txt 2>&1; grep -E "^(Exclusive 132 QP\(s\), doorbell|Warp 264)|passed" $O/$name.txt; }
ARGS="--no-consumer"
run a_none X=1
run b_none_walk GDAKI_DIAG_WALK=1
run c_none X=1
run d_none_walk GDAKI_DIAG_WALK=1
ARGS=""
run e_cons X=1
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/w.tar.xz -C $OUT w && rm -rf $O
