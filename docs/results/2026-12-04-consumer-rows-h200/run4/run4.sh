#!/bin/bash
# Diagnostic: which posters are slow in the two consumer rows, and whether the NIC's work during the round matters.
# (This build stored each poster's SM id in the low 8 bits of its start time; run8's build the SM clock instead.)
set -u
cd "$(dirname "$0")"
O=$OUT/e; mkdir -p $O
S=$SECONDS
export GDAKI_DIAG_DUMP=1 GDAKI_DIAG_ROWS="doorbell/32,Warp 264"
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $* $ARGS" > $O/$name.txt; env "$@" timeout 80 ./post_rate $ARGS >> $O/$name.txt 2>&1; grep -E "^(Exclusive 132|Warp 264)|passed" $O/$name.txt; }
ARGS="--no-consumer"; run a_none X=1
ARGS=""; run b_default X=1
run c_nomirror GDAKI_DIAG_NO_MIRROR=1
run d_pause1ms GDAKI_DIAG_PASS_PAUSE_US=1000
run e_pause1ms_nomirror GDAKI_DIAG_PASS_PAUSE_US=1000 GDAKI_DIAG_NO_MIRROR=1
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/e.tar.xz -C $OUT e && rm -rf $O
