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
}


def once(code: str) -> float:
    p = subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); {code}; print(time.perf_counter()-t)"], capture_output=True, text=True, check=True)
    return float(p.stdout.strip().splitlines()[-1]) * 1000


def main(runs: int) -> None:
    samples: dict[str, list[float]] = {name: [] for name in SNIPPETS}
    for _ in range(runs):
        for name, code in SNIPPETS.items():
            samples[name].append(once(code))
    med = {name: statistics.median(xs) for name, xs in samples.items()}
    for name, ms in med.items():
        print(f"{name:<58} {ms:8.1f} ms (median of {runs}, interleaved)")
    nvml = med["import pynvml + nvmlInit + capability (NVML's own cost)"]
    print(f"first profile() over NVML's own cost: {med['import hwprofile + profile(0)'] - nvml:+.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 25)
