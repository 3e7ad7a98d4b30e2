# wheels of main at 268a0ba (.whl carried); nvidia-h100-x1 (NVIDIA H100 80GB HBM3, driver 580.159.04), 2026-12-06
set -u
export SITE=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl
export PYTHONPATH=$SITE
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/r/host.txt
export HWPROFILE_CONFIG_DIR=/tmp/cfg
( OUT=$OUT/r timeout 120 python3 benchmarks/promises.py > $OUT/r/promises.log 2>&1; echo "rc=$?" >> $OUT/r/promises.log )
tail -9 $OUT/r/promises.log
( timeout 170 python3 -m pytest -q -p no:cacheprovider -x -rs tests/trust/test_verify_gpu.py tests/ops/test_moe_gate_gpu.py "tests/kernels/test_gpu_kernels.py" -k "fp8 or verify or gate or instance" > $OUT/r/gpu_tests.log 2>&1; echo "rc=$?" >> $OUT/r/gpu_tests.log )
tail -6 $OUT/r/gpu_tests.log
( OUT=$OUT/r timeout 60 python3 benchmarks/gate_floor_h200.py floor > $OUT/r/gate_floor.log 2>&1; echo "rc=$?" >> $OUT/r/gate_floor.log )
tail -25 $OUT/r/gate_floor.log
( OUT=$OUT/r timeout 75 python3 benchmarks/fp8m_h200.py --ms 1,2,4,8,16,32 --passes 2 --reps 5 --max-seconds 60 > $OUT/r/fp8m.log 2>&1; echo "rc=$?" >> $OUT/r/fp8m.log )
tail -30 $OUT/r/fp8m.log
