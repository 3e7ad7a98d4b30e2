#!/usr/bin/env bash
# The H200 run behind benchmarks/RESULTS.md's kernel section (issue 15): GPU tests, `hwprofile
# sweep` of the four ops, bench_ops.py; everything packed into $OUT/final.tgz (the device returns
# at most 8 files). Run from the repository root with the wheels installed (device_wheels.sh).
set -u
R=/tmp/final
rm -rf "$R" && mkdir -p "$R/sweeps" "$R/bench"
hw() { python3 -c 'import sys; from hwprofile.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
pack() { tar czf "$OUT/final.tgz" -C /tmp final; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$R/gpu.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py tests/test_gpu_kernels_sm90.py tests/test_ops.py tests/test_kernel_plans.py > "$R/gpu_tests.log" 2>&1
tail -3 "$R/gpu_tests.log"; pack
for op in router_gemm linear_bf16_fp32 gemv fp8_gemv; do
  hw sweep "$op" --output "$R/sweeps/$op.toml" --plot "$R/sweeps/$op.png" > "$R/sweeps/$op.log" 2>&1
  tail -4 "$R/sweeps/$op.log"; pack
done
OUT="$R" python3 benchmarks/variants_sm90.py 6 > "$R/variants_sm90_round6.log" 2>&1; tail -1 "$R/variants_sm90_round6.log"; pack
OUT="$R/bench" python3 benchmarks/bench_ops.py > "$R/bench/bench.log" 2>&1
grep -E "^router M=( 1|16)|^gemv|^fp8|host" "$R/bench/bench.log"; pack
