#!/bin/bash
# post_rate with one launch per round in both modes (the landing build), --one-launch, host-memory queues; a
# diagnostic of rounds 8x longer; the GPU post-rate tests.
set -u
cd "$(dirname "$0")"
O=$OUT/f; mkdir -p $O
S=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,pcie.link.gen.current,pcie.link.width.current --format=csv > $O/00-gpu.txt 2>&1
run() { local name=$1; shift; echo "== $name ($((SECONDS-S)) s)"; echo "== $name: $*" > $O/$name.txt; timeout 100 "$@" >> $O/$name.txt 2>&1; grep -E "^(Exclusive 132 QP\(s\), doorbell/32|Warp 264)|passed" $O/$name.txt; }
run cons1 ./post_rate
run none_gpu ./post_rate --no-consumer
run one_launch ./post_rate --one-launch
run cons2 ./post_rate
run cons_host ./post_rate --queues host
run none_host ./post_rate --queues host --no-consumer
export GDAKI_DIAG_ROWS="doorbell/32"
run diag_long_one_launch ./post_rate_diag --posts 8192
run diag_long_per_round env GDAKI_DIAG_PER_ROUND=1 ./post_rate_diag --posts 8192
unset GDAKI_DIAG_ROWS
for q in gpu host; do echo "== test $q" >> $O/tests.txt; GDAKI_QUEUES=$q timeout 120 ./postrate_test --ignored --test-threads=1 >> $O/tests.txt 2>&1; done
grep "test result" $O/tests.txt
echo "done ($((SECONDS-S)) s)"
tar cJf $OUT/f.tar.xz -C $OUT f && rm -rf $O
