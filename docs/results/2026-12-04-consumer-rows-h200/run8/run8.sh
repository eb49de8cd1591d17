#!/bin/bash
# Diagnostic: the SM clock during each round (%clock64 over %globaltimer), one launch for every round or one per round.
set -u
cd "$(dirname "$0")"
O=$OUT/z; mkdir -p $O
S=$SECONDS
export GDAKI_DIAG_DUMP=1 GDAKI_DIAG_ROWS="doorbell/32"
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $* $ARGS" > $O/$name.txt; env "$@" timeout 100 ./post_rate $ARGS >> $O/$name.txt 2>&1; grep -E "^(Exclusive 132 QP\(s\), doorbell)|passed|MHz" $O/$name.txt | tail -25; }
ARGS=""
run a_cons X=1
run b_cons_per_round GDAKI_DIAG_PER_ROUND=1
ARGS="--no-consumer"
run c_none X=1
echo "done ($((SECONDS-S)) s)"
nvidia-smi -q -d CLOCK,PERFORMANCE | head -60 > $O/clocks.txt
tar cJf $OUT/z.tar.xz -C $OUT z && rm -rf $O
