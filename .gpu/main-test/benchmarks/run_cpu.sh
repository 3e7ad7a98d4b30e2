#!/usr/bin/env bash
# The one runner for a CPU machine (no GPU; the CI kind). Each suite writes its raw output under
# benchmarks/cpu/<date>-<suite>/ (date +%F; a second run of a suite on the same day gets -2, -3, ...),
# beside host.txt (CPU, load, versions) and commands.txt (every command it ran, with its exit status).
set -u
cd "$(dirname "$0")/.." || exit 1

SUITES=(eager import agreement compile)

usage() {
  cat <<'EOF'
usage: benchmarks/run_cpu.sh SUITE...      with hwprofile, its plugins and torch installed in $PYTHON
       benchmarks/run_cpu.sh -h | --help

suites (raw output in benchmarks/cpu/<date>-<suite>/; the device is a simulated H200):
  eager      cpu_eager_floor.py: the op's own cost through the CPU test seam, and the wrapper floor
  import     bench_import.py --cpu --tuned (import, first profile(), with and without tuned files) and
             startup_breakdown.py steps importtime
  agreement  bench_agreement.py on gloo with RANKS ranks (default "2 3 4"), 300 iterations each
  compile    hwprofile compile --arch all: every plugin kernel for every target through NVRTC, fresh cache

environment: PYTHON (default python3), RUNS (import rounds, default 25), RANKS.
For numbers "where users are", run it from a clean venv holding only the non-editable installs
(python -m venv V && V/bin/pip install ./core ./plugins/sm90 ./plugins/sm100 ./plugins/sm120 torch;
PYTHON=V/bin/python benchmarks/run_cpu.sh import). The machine's load swings these numbers:
host.txt records the load average at the start.
EOF
}

die_usage() { echo "run_cpu.sh: $1" >&2; usage >&2; exit 2; }

RUN=()
for a in "$@"; do
  case "$a" in
    -h | --help) usage; exit 0 ;;
    -*) die_usage "unknown option $a" ;;
    *)
      ok=0
      for s in "${SUITES[@]}"; do [ "$a" = "$s" ] && ok=1; done
      [ "$ok" = 1 ] || die_usage "unknown suite '$a' (suites: ${SUITES[*]})"
      RUN+=("$a")
      ;;
  esac
done
[ ${#RUN[@]} -gt 0 ] || die_usage "no suite given"

PY="${PYTHON:-python3}"
if ! "$PY" -c "import hwprofile, hwprofile_sm90, torch" 2>/dev/null; then
  echo "run_cpu.sh: $PY cannot import hwprofile, hwprofile_sm90 and torch: install ./core ./plugins/sm90 (and torch) first" >&2
  exit 1
fi
export HWPROFILE_DEVICE="${HWPROFILE_DEVICE:-h200}"
hw() { "$PY" -c 'import sys; from hwprofile.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
WRITTEN=()
FAILED=0
D=""
# shellcheck source=benchmarks/_runner.sh
. benchmarks/_runner.sh  # the working directory is the repository root (cd above)


host_info() {
  {
    echo "date: $(date -u '+%F %T UTC')"
    echo "commit: $(git log --oneline -1 2>/dev/null || echo 'no git metadata')"
    echo "cpus: $(nproc); load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
    lscpu 2>/dev/null | grep -E "Model name|MHz"
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "at", sys.executable, "torch", torch.__version__)' 2>&1
    "$PY" -c 'import hwprofile; print("hwprofile", hwprofile.__version__, "from", hwprofile.__file__)' 2>&1
    echo "HWPROFILE_DEVICE=$HWPROFILE_DEVICE"
  } > "$D/host.txt"
}


suite_eager() {
  step eager_floor.log "$PY" benchmarks/cpu_eager_floor.py
  cat "$D/eager_floor.log"
}

suite_import() {
  step import.log "$PY" benchmarks/bench_import.py "${RUNS:-25}" --cpu --tuned
  step startup_steps.log "$PY" benchmarks/startup_breakdown.py 21 steps importtime
  cat "$D/import.log"
}

suite_agreement() {
  local n
  # shellcheck disable=SC2086 # RANKS is a list of rank counts
  for n in ${RANKS:-2 3 4}; do
    step "agreement_gloo_$n.log" "$PY" benchmarks/bench_agreement.py --nproc "$n" --iters 300 --json "$D/agreement_gloo_$n.json"
    cat "$D/agreement_gloo_$n.log"
  done
}

suite_compile() {
  local cache
  cache=$(mktemp -d)  # private (0700), empty: every instance compiles
  step compile.log env HWPROFILE_CACHE_DIR="$cache" "$PY" -c \
    'import sys; from hwprofile.cli import main; sys.exit(main(sys.argv[1:]))' compile --arch all --jobs "$(nproc)"
  rm -rf "$cache"
  tail -5 "$D/compile.log"
}

for s in "${RUN[@]}"; do
  D=$(new_dir cpu "$s") || exit 1
  WRITTEN+=("$D")
  echo "== $s -> $D"
  host_info
  "suite_$s"
done
echo "done: ${WRITTEN[*]}; $FAILED step(s) failed"
[ "$FAILED" -eq 0 ]
