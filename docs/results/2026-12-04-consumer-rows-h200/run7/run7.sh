#!/bin/bash
# Diagnostic: one launch for every round or one launch per round, with and without a consumer.
set -u
cd "$(dirname "$0")"
O=$OUT/y; mkdir -p $O
S=$SECONDS
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $* $ARGS" > $O/$name.txt; env "$@" timeout 100 ./post_rate $ARGS >> $O/$name.txt 2>&1; grep -E "^(Exclusive 132 QP\(s\), doorbell|Warp 264)|passed" $O/$name.txt; }
export GDAKI_DIAG_ROWS="doorbell"
ARGS=""
run a_cons X=1
run b_cons_per_round GDAKI_DIAG_PER_ROUND=1
ARGS="--no-consumer"
run c_none X=1
run d_none_one_launch GDAKI_DIAG_ONE_LAUNCH=1
export GDAKI_DIAG_ROWS="Warp 264"
ARGS=""
run e_cons_warp_per_round GDAKI_DIAG_PER_ROUND=1
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/y.tar.xz -C $OUT y && rm -rf $O
