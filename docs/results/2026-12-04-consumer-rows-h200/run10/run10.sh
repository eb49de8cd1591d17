#!/bin/bash
# Does a busy host core change the post path's times with nothing consuming? (The emulated UAR is host memory.)
set -u
cd "$(dirname "$0")"
O=$OUT/h; mkdir -p $O
S=$SECONDS
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $*" > $O/$name.txt; timeout 60 "$@" >> $O/$name.txt 2>&1; grep -E "^(Exclusive 1 QP\(s\), doorbell/1|Exclusive 1 QP\(s\), BlueFlame|Warp 1 QP|Warp 264|floor: ordering only, 1 QP)|passed" $O/$name.txt; }
spin() { for i in $(seq 1 $1); do ( while :; do :; done ) & done; }
run a_idle ./post_rate --no-consumer
spin 1; sleep 1
run b_spin1 ./post_rate --no-consumer
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; sleep 1
run c_idle ./post_rate --no-consumer
spin 8; sleep 1
run d_spin8 ./post_rate --no-consumer
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/h.tar.xz -C $OUT h && rm -rf $O
