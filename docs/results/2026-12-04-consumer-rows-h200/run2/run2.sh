#!/bin/bash
# GPU tests of the new build, GPU-memory then host-memory queues.
set -u
cd "$(dirname "$0")"
O=$OUT/t; mkdir -p $O
S=$SECONDS
for q in gpu host; do
  for t in t/*; do
    [ $((SECONDS-S)) -lt 500 ] || break
    echo "== $q $t ($((SECONDS-S)) s)" | tee -a $O/tests_$q.txt
    GDAKI_QUEUES=$q timeout 150 $t --ignored --test-threads=1 >> $O/tests_$q.txt 2>&1
    tail -1 $O/tests_$q.txt; grep "test result" $O/tests_$q.txt | tail -1
  done
done
