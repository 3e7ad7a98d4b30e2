"""Cost of each NVML query detection makes (median of 50 calls, one process), to decide what to read eagerly.

Usage: python3 benchmarks/bench_nvml.py (``benchmarks/run_h200.sh import`` runs it).
"""

from __future__ import annotations

import argparse
import statistics
import time

argparse.ArgumentParser(description=__doc__).parse_args()

import pynvml  # noqa: E402 - after --help, which needs no NVML

t0 = time.perf_counter()
pynvml.nvmlInit()
print(f"nvmlInit {1000 * (time.perf_counter() - t0):.2f} ms")
h = pynvml.nvmlDeviceGetHandleByIndex(0)
queries = {
    "DeviceGetCount": pynvml.nvmlDeviceGetCount,
    "GetHandleByIndex": lambda: pynvml.nvmlDeviceGetHandleByIndex(0),
    "GetName": lambda: pynvml.nvmlDeviceGetName(h),
    "GetCudaComputeCapability": lambda: pynvml.nvmlDeviceGetCudaComputeCapability(h),
    "GetUUID": lambda: pynvml.nvmlDeviceGetUUID(h),
    "GetPciInfo": lambda: pynvml.nvmlDeviceGetPciInfo(h),
    "GetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
    "GetMaxClockInfo SM": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
    "GetMaxClockInfo MEM": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
    "GetMemoryBusWidth": lambda: pynvml.nvmlDeviceGetMemoryBusWidth(h),
    "GetNumGpuCores": lambda: pynvml.nvmlDeviceGetNumGpuCores(h),
    "SystemGetDriverVersion": pynvml.nvmlSystemGetDriverVersion,
    "SystemGetCudaDriverVersion": pynvml.nvmlSystemGetCudaDriverVersion,
}
for name, fn in queries.items():
    ts = []
    for _ in range(50):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    print(f"{name:<28} {1e6 * statistics.median(ts):9.1f} us (first {1e6 * ts[0]:9.1f} us)")
t0 = time.perf_counter()
pynvml.nvmlShutdown()
print(f"nvmlShutdown {1000 * (time.perf_counter() - t0):.2f} ms")
