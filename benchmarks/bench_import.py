"""Import and first-profile cost in fresh processes (median of 15), beside NVML's own cost.

Usage: PYTHONPATH=core/src:plugins/sm90/src:plugins/sm100/src:plugins/sm120/src python benchmarks/bench_import.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys

SNIPPETS = {
    "interpreter": "pass",
    "import hwprofile": "import hwprofile",
    "import pynvml + nvmlInit + capability": "import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))",
    "import hwprofile + profile(0)": "import hwprofile; hwprofile.profile(0)",
    # breakdown of the first profile() (each in a fresh process)
    "import importlib.metadata": "import importlib.metadata",
    "entry_points(group='hwprofile.plugins')": "from importlib.metadata import entry_points; entry_points(group='hwprofile.plugins')",
    "hwprofile.detect() (NVML probe)": "import hwprofile; hwprofile.detect()",
    "registry: load plugins": "from hwprofile.profiles import registry; registry()",
}


def run(code: str, n: int = 15) -> float:
    ts = []
    for _ in range(n):
        p = subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); {code}; print(time.perf_counter()-t)"], capture_output=True, text=True, check=True)
        ts.append(float(p.stdout.strip().splitlines()[-1]) * 1000)
    return statistics.median(ts)


def main() -> None:
    wall = {}
    for name, code in SNIPPETS.items():
        wall[name] = run(code)
    for name, ms in wall.items():
        print(f"{name:<42} {ms:8.1f} ms (in-process, median of 15 fresh processes)")


if __name__ == "__main__":
    main()
