#!/usr/bin/env bash
# The H200 run of 2026-11-30 (late session): the whole test suite on the GPU, issue 11's eager host
# cost (bench_ops.py eager) and engine benchmark, and Nsight Compute counters of the GEMV kernels
# against cuBLAS (ncu_gemv.py). Everything lands in $OUT/s3.tgz. Run from the repository root with
# the wheels installed (device_wheels.sh).
set -u
R=/tmp/s3
rm -rf "$R" && mkdir -p "$R"
pack() { tar czf "$OUT/s3.tgz" -C /tmp s3; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$R/gpu.txt" 2>&1
nproc >> "$R/gpu.txt"; lscpu | grep -E "Model name|MHz" >> "$R/gpu.txt"
IGN=$(python3 -c "import hypothesis" 2>/dev/null || echo "--ignore=tests/test_settings.py --ignore=tests/test_sweep.py")
( time python3 -m pytest -q -p no:cacheprovider tests $IGN ) > "$R/gpu_tests.log" 2>&1
tail -4 "$R/gpu_tests.log"; pack
TS=$(command -v taskset >/dev/null && echo "taskset -c 3")
OUT="$R" $TS python3 benchmarks/bench_ops.py eager > "$R/eager.log" 2>&1
grep -E "MISSES|host" "$R/eager.log" | head -20; pack
OUT="$R" python3 benchmarks/bench_engine.py > "$R/engine.log" 2>&1
tail -22 "$R/engine.log"; pack
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
OUT="$R" timeout 240 "$NCU" --profile-from-start off --clock-control none --cache-control all \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --csv --page details --log-file "$R/ncu.csv" python3 benchmarks/ncu_gemv.py > "$R/ncu.log" 2>&1
tail -3 "$R/ncu.log"; wc -l "$R/ncu.csv"; pack
