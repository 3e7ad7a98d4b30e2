"""Where the first ``profile()`` spends its time, step by step, in fresh processes.

Four views, each in its own fresh interpreter so that nothing is warm:

* ``steps``: wall time of each step of ``import pynvml; import hwprofile; detect(); profile(0)``
  (median over ``runs`` processes), so the cost above NVML's own start is split into import,
  NVML probe, registry and resolving;
* ``paired``: in each fresh process, first NVML's own cost exactly as the issue measures it
  (``import pynvml`` + ``nvmlInit`` + one capability query), then, with NVML still initialised,
  every step of hwprofile's first ``profile(0)``, and last the ``nvmlShutdown`` that detection
  does (NVML's teardown, which hwprofile's cold detection pays). Both costs come from the same
  process, so the machine's process-to-process swings (20-30 ms on the H200 host) cancel out;
* ``importtime``: ``python -X importtime`` of the same, the modules sorted by self time;
* ``cprofile``: one cProfile of ``profile(0)`` after ``import pynvml``, by own and cumulative time.

Usage (hwprofile and its plugins installed; ``benchmarks/run_h200.sh import``):
python3 benchmarks/startup_breakdown.py [runs] [views...]   (views: paired steps importtime cprofile; default all)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

STEPS = r"""
import time
t0 = time.perf_counter()
import pynvml
t1 = time.perf_counter()
import hwprofile
t2 = time.perf_counter()
import hwprofile.device, hwprofile.profiles
t3 = time.perf_counter()
hwprofile.detect()
t4 = time.perf_counter()
from hwprofile import profiles
profiles.registry()
t5 = time.perf_counter()
hwprofile.profile(0)
t6 = time.perf_counter()
ms = [1000 * (b - a) for a, b in zip((t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6))]
print(" ".join(f"{x:.3f}" for x in ms))
"""
STEP_NAMES = (
    "import pynvml", "import hwprofile", "import device+profiles", "detect() (NVML probe)",
    "registry (entry points, plugin imports)", "resolve profile(0)",
)

PAIRED = r"""
import time
c = [time.perf_counter()]
import pynvml
pynvml.nvmlInit()
pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
c.append(time.perf_counter())
import hwprofile
c.append(time.perf_counter())
from hwprofile import device, profiles, registry
c.append(time.perf_counter())
hwprofile.detect()
c.append(time.perf_counter())
eps = registry.find_entry_points(registry.ENTRY_POINT_GROUP)
c.append(time.perf_counter())
import importlib
for ep in eps:
    importlib.import_module(ep.value.partition(":")[0].strip())
c.append(time.perf_counter())
profiles.registry()
c.append(time.perf_counter())
import hashlib
c.append(time.perf_counter())
hwprofile.profile(0)
c.append(time.perf_counter())
pynvml.nvmlShutdown()
c.append(time.perf_counter())
print(" ".join(f"{1000 * (b - a):.3f}" for a, b in zip(c, c[1:])))
"""
PAIRED_NAMES = (
    "NVML's own: import pynvml + nvmlInit + capability",
    "import hwprofile",
    "import device, profiles, registry, settings",
    "detect() (NVML already initialised)",
    "entry-point scan",
    "import the plugin modules",
    "register plugins (pluggy, hwprofile_arch)",
    "import hashlib",
    "resolve profile(0)",
    "nvmlShutdown (detection's teardown)",
)

CPROFILE = r"""
import cProfile, io, pstats
import pynvml
cp = cProfile.Profile()
cp.enable()
import hwprofile
hwprofile.profile(0)
cp.disable()
for key in ("tottime", "cumulative"):
    s = io.StringIO()
    pstats.Stats(cp, stream=s).sort_stats(key).print_stats(35)
    print(s.getvalue())
"""


def _py(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, check=True)


def steps(runs: int) -> None:
    rows = [[float(x) for x in _py(STEPS).stdout.split()] for _ in range(runs)]
    for i, name in enumerate(STEP_NAMES):
        col = [r[i] for r in rows]
        print(f"{name:<42} median {statistics.median(col):7.2f} ms  min {min(col):7.2f}  max {max(col):7.2f}")
    print(f"{'sum after import pynvml':<42} median {statistics.median(sum(r[1:]) for r in rows):7.2f} ms")


def paired(runs: int) -> None:
    rows = [[float(x) for x in _py(PAIRED).stdout.split()] for _ in range(runs)]
    for i, name in enumerate(PAIRED_NAMES):
        col = [r[i] for r in rows]
        print(f"{name:<50} median {statistics.median(col):7.2f} ms  min {min(col):7.2f}  max {max(col):7.2f}")
    ours = [sum(r[1:]) for r in rows]
    nvml = [r[0] for r in rows]
    print(
        f"{'hwprofile above NVML (all steps after the first)':<50} median {statistics.median(ours):7.2f} ms  "
        f"min {min(ours):7.2f}  max {max(ours):7.2f}"
    )
    print(f"{'ratio to NVML own, per process':<50} median {statistics.median(o / n for o, n in zip(ours, nvml, strict=True)):7.3f}")


def importtime() -> None:
    _py("import pynvml; import hwprofile; hwprofile.profile(0)", "-X", "importtime")  # warm the bytecode cache
    err = _py("import pynvml; import hwprofile; hwprofile.profile(0)", "-X", "importtime").stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line and "self" not in line:
            self_us, cum_us, name = line[len("import time:") :].split("|")
            rows.append((int(self_us), int(cum_us), name.rstrip()))
    after = [r for r in rows[[r[2].strip() for r in rows].index("pynvml") + 1 :]] if any(r[2].strip() == "pynvml" for r in rows) else rows
    print(f"modules imported after pynvml: {len(after)}, self time {sum(r[0] for r in after) / 1000:.1f} ms")
    for self_us, cum_us, name in sorted(after, reverse=True)[:30]:
        print(f"{self_us / 1000:7.2f} ms self {cum_us / 1000:7.2f} ms cum  {name}")


def cprofile() -> None:
    print(_py(CPROFILE).stdout)


VIEWS = ("paired", "steps", "importtime", "cprofile")

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="?", type=int, default=20, help="fresh processes per view (default 20)")
    p.add_argument("views", nargs="*", metavar="view", help=f"any of {', '.join(VIEWS)} (default: all four)")
    a = p.parse_args()
    if set(a.views) - set(VIEWS):
        p.error(f"unknown view(s) {', '.join(sorted(set(a.views) - set(VIEWS)))}; choose from {', '.join(VIEWS)}")
    n = a.runs
    views = a.views or list(VIEWS)
    print(f"python {sys.version.split()[0]}, dont_write_bytecode={sys.flags.dont_write_bytecode}")
    for v in views:
        print(f"== {v}")
        {"paired": lambda: paired(n), "steps": lambda: steps(n), "importtime": importtime, "cprofile": cprofile}[v]()
