"""Environment checks behind ``hwprofile doctor``: what is missing, in plain words, and the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    name: str
    status: str  # OK | WARN | FAIL | INFO
    detail: str
    fix: str = ""


def run_checks() -> list[Check]:
    """Every check; FAIL only for what compiling or running kernels needs and is broken."""
    from . import device, jit

    out: list[Check] = []
    det = device.detect()
    if det.devices:
        names = ", ".join(f"{d.index}: {d.name} ({d.sm}{', simulated' if d.simulated else ''})" for d in det.devices)
        out.append(Check("devices", "OK", names))
        d0 = det.devices[0]
        if d0.cuda_driver_version:
            out.append(Check("driver", "OK", f"{d0.driver_version}, CUDA {d0.cuda_driver_version[0]}.{d0.cuda_driver_version[1]}"))
    else:
        out.append(Check("devices", "INFO", f"no NVIDIA GPU ({det.reason}); compile-only use and simulation still work"))
    try:
        import cuda.bindings

        out.append(Check("cuda-python", "OK", f"cuda-bindings {cuda.bindings.__version__}"))
    except ImportError:
        out.append(Check("cuda-python", "FAIL", "cuda-bindings is not installed", "pip install 'hwprofile[cu13]' (or [cu12] for a CUDA 12 driver)"))
        return out
    try:
        v = jit.nvrtc_version()
        archs = jit.nvrtc_archs()
        out.append(Check("nvrtc", "OK", f"NVRTC {v[0]}.{v[1]}, targets sm_{', sm_'.join(map(str, archs))}"))
    except Exception as exc:  # noqa: BLE001
        out.append(Check("nvrtc", "FAIL", f"NVRTC not usable: {exc}", "pip install 'hwprofile[cu13]' (nvidia-cuda-nvrtc)"))
        return out
    dirs = jit.include_dirs()
    cudart = [d for d in dirs[1:]]
    from pathlib import Path

    if cudart and (Path(cudart[0]) / "cuda_bf16.h").is_file() and (Path(cudart[0]) / "cuda_fp8.h").is_file():
        out.append(Check("headers", "OK", f"cuda_bf16.h and cuda_fp8.h in {cudart[0]}"))
    else:
        out.append(Check("headers", "FAIL", "CUDA headers (cuda_bf16.h, cuda_fp8.h) not found by cuda.pathfinder", "pip install nvidia-cuda-runtime"))
    if det.devices and not det.simulated:
        problem = jit.check_driver_for_nvrtc(det.devices[0].cuda_driver_version)
        out.append(Check("nvrtc vs driver", "FAIL" if problem else "OK", problem or "cubins from this NVRTC load on this driver", "see detail" if problem else ""))
    return out
