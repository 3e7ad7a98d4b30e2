# shellcheck shell=bash
# Shared by run_h200.sh and run_cpu.sh (sourced, never run): the dated output folder and the logged step.
# The sourcing script sets D (the suite's folder) and FAILED before a step, and may define
# after_step (run_h200.sh packs what it wrote for the device tool after every step).

# new_dir MACHINE SUITE: benchmarks/<machine>/<date>-<suite>, or -2, -3, ... when a run of that suite already has the day
new_dir() {
  local base d i=2
  base="benchmarks/$1/$(date +%F)-$2"
  d="$base"
  while [ -e "$d" ]; do d="$base-$i"; i=$((i + 1)); done
  mkdir -p "$d" && echo "$d"
}

# step FILE CMD...: run CMD with stdout and stderr in $D/FILE; log it, its exit status and wall time in commands.txt
step() {
  local file=$1 rc t0
  shift
  echo "\$ $* > $file" >> "$D/commands.txt"
  t0=$SECONDS
  "$@" > "$D/$file" 2>&1
  rc=$?
  echo "# exit $rc after $((SECONDS - t0)) s" >> "$D/commands.txt"
  if [ $rc -ne 0 ]; then
    FAILED=$((FAILED + 1))
    echo "  FAILED ($rc): $* (see $D/$file)"
  fi
  if declare -F after_step >/dev/null; then after_step; fi
  return $rc
}
