#!/bin/bash
# Host-memory queues, 132 QPs with a doorbell per 32 posts: does the NIC's reading of the rings while they post
# slow the posters? (Diagnostic build: a launch per round, the NIC thread asleep 1 ms after each busy pass.)
set -u
cd "$(dirname "$0")"
O=$OUT/k; mkdir -p $O
S=$SECONDS
export GDAKI_DIAG_ROWS="doorbell/32" GDAKI_DIAG_PER_ROUND=1
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $*" > $O/$name.txt; timeout 60 "$@" >> $O/$name.txt 2>&1; grep -E "^Exclusive 132|passed" $O/$name.txt; }
run a_none ./post_rate_diag --queues host --no-consumer
run b_cons ./post_rate_diag --queues host
run c_cons_pause env GDAKI_DIAG_PASS_PAUSE_US=1000 ./post_rate_diag --queues host
run d_cons ./post_rate_diag --queues host
run e_cons_pause env GDAKI_DIAG_PASS_PAUSE_US=1000 ./post_rate_diag --queues host
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/k.tar.xz -C $OUT k && rm -rf $O
