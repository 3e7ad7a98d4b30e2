#!/usr/bin/env bash
# One H200 call of the structure step: before (bb8d2f9 wheels) against after (HEAD wheels), same machine.
# usage: .gpu/run.sh eager | tests | import
set -u
cd "$(dirname "$0")"
G=$PWD
R=/tmp/res; mkdir -p $R
if [ ! -d /tmp/site_after ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_after after/whl/*.whl deps/*.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_before before/whl/*.whl deps/*.whl
fi
export HWPROFILE_CACHE_DIR=/tmp/hwpcache; mkdir -p -m 700 $HWPROFILE_CACHE_DIR
export PYTHONUNBUFFERED=1
TS="taskset -c 3"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $R/host.txt 2>&1; date -u >> $R/host.txt
for what in "$@"; do
  case "$what" in
  eager)
    for side in ${SIDES:-after before}; do
      if [ $side = after ]; then script=benchmarks/bench_ops.py; else script=bench_ops.py; fi
      ( cd $G/$side && PYTHONPATH=/tmp/site_$side OUT=$R/eager_$side timeout 280 $TS python3 $script eager ) > $R/eager_$side.log 2>&1
      echo "== eager $side rc=$?"; grep -E "front|MISSES" $R/eager_$side.log | cut -c1-160 | head -12
    done ;;
  tests)
    ( cd $G/after && PYTHONPATH=/tmp/site_after timeout 420 python3 -m pytest -q -p no:cacheprovider tests plugins/sm90/tests plugins/sm120/tests pytest-hwprofile/tests ) > $R/gpu_tests.log 2>&1
    echo "== tests rc=$?"; tail -4 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | head ;;
  import)
    for side in after before; do
      if [ $side = after ]; then script=benchmarks/bench_import.py; else script=bench_import.py; fi
      ( cd $G/$side && PYTHONPATH=/tmp/site_$side timeout 200 python3 $script 15 ) > $R/import_$side.log 2>&1
      echo "== import $side rc=$?"; cat $R/import_$side.log | cut -c1-150 | head -12
    done ;;
  esac
  tar czf "$OUT/h200-structure.tgz" -C /tmp res
done
