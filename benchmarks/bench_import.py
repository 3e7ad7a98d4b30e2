"""Import and first-profile cost in fresh processes, beside NVML's own cost.

The snippets are run interleaved (A, B, C, A, B, C, ...) so that drift of the machine affects all
of them alike; each row is the median of the in-process times. Usage:
PYTHONPATH=core/src:plugins/sm90/src:plugins/sm100/src:plugins/sm120/src python benchmarks/bench_import.py [runs]
"""

from __future__ import annotations

import statistics
import subprocess
import sys

SNIPPETS = {
    "import hwprofile": "import hwprofile",
    "import pynvml + nvmlInit + capability (NVML's own cost)": "import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))",
    "import hwprofile + profile(0)": "import hwprofile; hwprofile.profile(0)",
    "import hwprofile + detect() (NVML probe)": "import hwprofile; hwprofile.detect()",
    "NVML's own cost + nvmlShutdown (as detection does)": "import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0)); pynvml.nvmlShutdown()",
    # The same two, timed after `import pynvml` (run before the clock starts): that import is most of
    # NVML's cost and most of the process-to-process noise, and it is identical in both.
    "[pynvml imported] nvmlInit + capability": "pynvml.nvmlInit(); pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))",
    "[pynvml imported] import hwprofile + profile(0)": "import hwprofile; hwprofile.profile(0)",
}


def once(code: str, setup: str = "") -> float:
    """Milliseconds ``code`` takes in a fresh interpreter, after ``setup`` (not timed)."""
    p = subprocess.run([sys.executable, "-c", f"import time; {setup}; t=time.perf_counter(); {code}; print(time.perf_counter()-t)"], capture_output=True, text=True, check=True)
    return float(p.stdout.strip().splitlines()[-1]) * 1000


def main(runs: int) -> None:
    samples: dict[str, list[float]] = {name: [] for name in SNIPPETS}
    for _ in range(runs):
        for name, code in SNIPPETS.items():
            samples[name].append(once(code, "import pynvml" if name.startswith("[pynvml imported]") else "pass"))
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4)
        print(f"{name:<58} median {statistics.median(xs):7.1f} ms  quartiles {q[0]:6.1f} / {q[2]:6.1f}  min {min(xs):6.1f} (n={runs}, interleaved)")
    nvml = samples["import pynvml + nvmlInit + capability (NVML's own cost)"]
    ours = samples["import hwprofile + profile(0)"]
    # Two estimates of the cost above NVML's own: the difference of the medians, and the median of
    # the differences within each interleaved round (both snippets ran back to back). The minima
    # are the least noisy view of what the work itself costs.
    paired = [b - a for a, b in zip(nvml, ours, strict=True)]
    print(f"first profile() over NVML's own cost: {statistics.median(ours) - statistics.median(nvml):+.1f} ms (difference of medians), "
          f"{statistics.median(paired):+.1f} ms (median of paired differences), {min(ours) - min(nvml):+.1f} ms (difference of minima)")
    init = samples["[pynvml imported] nvmlInit + capability"]
    after = samples["[pynvml imported] import hwprofile + profile(0)"]
    pairs = [b - a for a, b in zip(init, after, strict=True)]
    print(f"same, with pynvml imported before the clock starts: {statistics.median(after) - statistics.median(init):+.1f} ms (difference of medians), "
          f"{statistics.median(pairs):+.1f} ms (median of paired differences), {min(after) - min(init):+.1f} ms (difference of minima)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 25)
