"""Import and first-profile cost in fresh processes, beside NVML's own cost.

The snippets are run interleaved (A, B, C, A, B, C, ...) so that drift of the machine affects all
of them alike; each row is the median of the in-process times. Usage (hwprofile and its plugins
installed, as ``benchmarks/run_h200.sh import`` and ``benchmarks/run_cpu.sh import`` do):
python3 benchmarks/bench_import.py [runs] [--cpu] [--tuned]

``--cpu``: no GPU needed (a clean venv on any machine): ``import hwprofile`` alone, after
``import torch``, and the first ``profile(0)`` of a simulated H200. ``--tuned``: the first-profile
snippets also run with a config dir holding the four H200 sweep files of
``benchmarks/h200/2026-11-30-sweeps-2`` (old format: raw samples inline) in the device's tuned
directory, interleaved with the same snippets without them (whose config dir is empty, so the
machine's own tuned files never count).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_NVML = "import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))"
SNIPPETS = {
    "import hwprofile": "import hwprofile",
    "import pynvml + nvmlInit + capability (NVML's own cost)": _NVML,
    "import hwprofile + profile(0)": "import hwprofile; hwprofile.profile(0)",
    "import hwprofile + detect() (NVML probe)": "import hwprofile; hwprofile.detect()",
    "NVML's own cost + nvmlShutdown (as detection does)": _NVML + "; pynvml.nvmlShutdown()",
    # The same two, timed after `import pynvml` (run before the clock starts): that import is most of
    # NVML's cost and most of the process-to-process noise, and it is identical in both.
    "[pynvml imported] nvmlInit + capability": _NVML.removeprefix("import pynvml; "),
    "[pynvml imported] import hwprofile + profile(0)": "import hwprofile; hwprofile.profile(0)",
}


#: four sweep files in the old format (raw samples inline, 20-30 KB each): the worst case a tuned directory held
TUNED_FILES = Path(__file__).parent / "h200" / "2026-11-30-sweeps-2"

CPU_SNIPPETS = {
    "import hwprofile": "import hwprofile",
    "[torch imported] import hwprofile": "import hwprofile",
    "[simulated h200] import hwprofile + profile(0)": "import hwprofile; hwprofile.profile(0)",
    "[torch imported, simulated h200] import hwprofile + profile(0)": "import hwprofile; hwprofile.profile(0)",
}


def once(code: str, setup: str = "", env: dict[str, str] | None = None) -> float:
    """Milliseconds ``code`` takes in a fresh interpreter, after ``setup`` (not timed)."""
    p = subprocess.run(
        [sys.executable, "-c", f"import time; {setup}; t=time.perf_counter(); {code}; print(time.perf_counter()-t)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return float(p.stdout.strip().splitlines()[-1]) * 1000


def tuned_config(device_dir: str) -> str:
    """A config dir whose tuned directory for ``device_dir`` holds the H200 sweep files."""
    d = tempfile.mkdtemp(prefix="hwp-bench-config-")
    target = Path(d) / "tuned" / device_dir
    target.mkdir(parents=True)
    for f in TUNED_FILES.glob("*.toml"):
        shutil.copy(f, target / f.name)
    return d


def cpu_main(runs: int, tuned: bool) -> None:
    """The snippets that need no GPU, interleaved; with ``tuned``, each profile snippet also with tuned files."""
    empty = tempfile.mkdtemp(prefix="hwp-bench-empty-")
    variants = [("", {**os.environ, "HWPROFILE_CONFIG_DIR": empty})]
    if tuned:
        variants.append((" [4 tuned files]", {**os.environ, "HWPROFILE_CONFIG_DIR": tuned_config("nvidia-h200-sm-90")}))
    rows: dict[str, tuple[str, str, dict[str, str]]] = {}
    for name, code in CPU_SNIPPETS.items():
        for suffix, env in variants:
            if suffix and "profile(0)" not in code:
                continue
            e = {**env, "HWPROFILE_DEVICE": "h200"} if "simulated" in name else env
            rows[name + suffix] = (code, "import torch" if "torch imported" in name else "pass", e)
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(runs):
        for name, (code, setup, env) in rows.items():
            samples[name].append(once(code, setup, env))
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4)
        print(f"{name:<78} median {statistics.median(xs):7.2f} ms  quartiles {q[0]:6.2f} / {q[2]:6.2f}  min {min(xs):6.2f} (n={runs})")


def main(runs: int, tuned: bool = False) -> None:
    """On the GPU host; with ``tuned``, the first-profile snippets also run with the tuned files present (interleaved)."""
    empty = tempfile.mkdtemp(prefix="hwp-bench-empty-")
    base = {**os.environ, "HWPROFILE_CONFIG_DIR": empty}  # no tuned files from the machine's own config dir
    rows = {name: (code, base) for name, code in SNIPPETS.items()}
    if tuned:  # the device's tuned directory, named as hwprofile.tuning.tuned_dir names it
        import hwprofile
        from hwprofile import tuning

        d = tuning.tuned_dir(hwprofile.detect().device(0), {"HWPROFILE_CONFIG_DIR": "/"}).name
        with_files = {**os.environ, "HWPROFILE_CONFIG_DIR": tuned_config(d)}
        print(f"tuned files present in the [4 tuned files] rows: {d}")
        rows |= {f"{name} [4 tuned files]": (code, with_files) for name, code in SNIPPETS.items() if "profile(0)" in code}
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(runs):
        for name, (code, env) in rows.items():
            samples[name].append(once(code, "import pynvml" if name.startswith("[pynvml imported]") else "pass", env))
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4)
        print(
            f"{name:<75} median {statistics.median(xs):7.1f} ms  quartiles {q[0]:6.1f} / {q[2]:6.1f}  "
            f"min {min(xs):6.1f} (n={runs}, interleaved)"
        )
    nvml = samples["import pynvml + nvmlInit + capability (NVML's own cost)"]
    ours = samples["import hwprofile + profile(0)"]
    # Two estimates of the cost above NVML's own: the difference of the medians, and the median of
    # the differences within each interleaved round (both snippets ran back to back). The minima
    # are the least noisy view of what the work itself costs.
    paired = [b - a for a, b in zip(nvml, ours, strict=True)]
    print(
        f"first profile() over NVML's own cost: {statistics.median(ours) - statistics.median(nvml):+.1f} ms (difference of medians), "
        f"{statistics.median(paired):+.1f} ms (median of paired differences), {min(ours) - min(nvml):+.1f} ms (difference of minima)"
    )
    init = samples["[pynvml imported] nvmlInit + capability"]
    after = samples["[pynvml imported] import hwprofile + profile(0)"]
    pairs = [b - a for a, b in zip(init, after, strict=True)]
    print(
        "same, with pynvml imported before the clock starts: "
        f"{statistics.median(after) - statistics.median(init):+.1f} ms (difference of medians), "
        f"{statistics.median(pairs):+.1f} ms (median of paired differences), {min(after) - min(init):+.1f} ms (difference of minima)"
    )
    if tuned:
        for name in ("import hwprofile + profile(0)", "[pynvml imported] import hwprofile + profile(0)"):
            nvml_row = init if name.startswith("[pynvml") else nvml
            t = samples[f"{name} [4 tuned files]"]
            d = [b - a for a, b in zip(nvml_row, t, strict=True)]
            print(
                f"{name} [4 tuned files] over NVML's own cost: "
                f"{statistics.median(t) - statistics.median(nvml_row):+.1f} ms (difference of medians), "
                f"{statistics.median(d):+.1f} ms (paired), {min(t) - min(nvml_row):+.1f} ms (minima)"
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="?", type=int, default=25, help="rounds of interleaved fresh processes (default 25)")
    p.add_argument("--cpu", action="store_true", help="the snippets that need no GPU, with a simulated H200")
    p.add_argument("--tuned", action="store_true", help="also run the first-profile snippets with four tuned files present")
    a = p.parse_args()
    if a.cpu:
        cpu_main(a.runs, a.tuned)
    else:
        main(a.runs, a.tuned)
