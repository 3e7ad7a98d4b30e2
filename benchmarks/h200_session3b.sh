#!/usr/bin/env bash
# Second H200 run of 2026-11-30 (late session): the tests that failed in the first run (h200_session3.sh)
# after their fixes, the ops tests, issue 11's eager host cost with the op's own cost isolated
# (bench_ops.py eager), the engine benchmark, sustained clocks of the large GEMVs (clocks_gemv.py),
# and Nsight Compute warp-state counters (ncu_gemv.py). Everything lands in $OUT/s3b.tgz.
set -u
R=/tmp/s3b
rm -rf "$R" && mkdir -p "$R"
pack() { tar czf "$OUT/s3b.tgz" -C /tmp s3b; }
python3 - > "$R/entrypoints.txt" 2>&1 <<'PY'
import glob, os, sys
from hwprofile._entrypoints import find_entry_points, _entry_points_slow
from hwprofile.doctor import collect
print([e for e in find_entry_points("hwprofile.plugins")])
print([e for e in _entry_points_slow("hwprofile.plugins")])
for d in sys.path:
    for m in glob.glob(os.path.join(d, "hwprofile_sm90*")):
        print(m, os.listdir(m) if os.path.isdir(m) else "")
print({k: v for k, v in collect().versions.items() if k.startswith("plugin")})
PY
python3 -m pytest -q -p no:cacheprovider tests/test_cli_firstrun.py tests/test_distributed_gloo.py tests/test_ops_compile.py \
  tests/test_sweep.py tests/test_distributed.py tests/test_ops.py tests/test_ops_gpu.py tests/test_ops_gates.py \
  tests/test_ops_contract.py tests/test_ops_review.py tests/test_gpu_kernels.py tests/test_gpu_kernels_sm90.py > "$R/gpu_tests.log" 2>&1
tail -3 "$R/gpu_tests.log"; grep -E "^FAILED" "$R/gpu_tests.log"; pack
TS=$(command -v taskset >/dev/null && echo "taskset -c 3")
OUT="$R" $TS python3 benchmarks/bench_ops.py eager > "$R/eager.log" 2>&1
grep -E "MISSES|front|host" "$R/eager.log" | cut -c1-220; pack
OUT="$R" python3 benchmarks/bench_engine.py > "$R/engine.log" 2>&1
grep -E "compile|eager" "$R/engine.log" | grep -v "^ " | head -12; pack
OUT="$R" python3 benchmarks/clocks_gemv.py > "$R/clocks.log" 2>&1; cat "$R/clocks.log" | cut -c1-250; pack
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
OUT="$R" timeout 200 "$NCU" --profile-from-start off --clock-control none --cache-control all \
  --section WarpStateStats --section SpeedOfLight --section InstructionStats \
  --csv --page raw --log-file "$R/ncu_raw.csv" python3 benchmarks/ncu_gemv.py > "$R/ncu.log" 2>&1
tail -2 "$R/ncu.log"; wc -l "$R/ncu_raw.csv"; pack
