#!/usr/bin/env bash
# Last H200 run of 2026-11-30 (late session), on the final code: the whole test suite and issue 11's
# eager host cost (bench_ops.py eager, pinned to one core). Everything lands in $OUT/s3d.tgz.
set -u
R=/tmp/s3d
rm -rf "$R" && mkdir -p "$R"
pack() { tar czf "$OUT/s3d.tgz" -C /tmp s3d; }
git log --oneline -1 > "$R/commit.txt" 2>/dev/null
( time python3 -m pytest -q -p no:cacheprovider tests ) > "$R/gpu_tests.log" 2>&1
tail -4 "$R/gpu_tests.log"; grep -E "^FAILED" "$R/gpu_tests.log"; pack
TS=$(command -v taskset >/dev/null && echo "taskset -c 3")
OUT="$R" $TS python3 benchmarks/bench_ops.py eager > "$R/eager.log" 2>&1
grep -E "MISSES|front" "$R/eager.log" | cut -c1-200; pack
