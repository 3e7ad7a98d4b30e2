"""``hwprofile doctor``: the environment report a bug needs (as ``torch.utils.collect_env`` gives), then checks.

Versions (Python, OS, hwprofile and each plugin, torch and its CUDA, cuda-bindings, NVRTC, the
NVIDIA wheels, the driver), the environment variables that change what hwprofile does, the paths it
uses, the devices (simulated ones marked as such), and checks with the fix for each failure.
Reading the report never fails: what cannot be read is reported as such. Never creates a CUDA context.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _env

_WHEELS = (
    "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime",
    "nvidia-cuda-runtime-cu12", "nvidia-cublas", "nvidia-cublas-cu12", "nvidia-ml-py", "pluggy",
)
_ENV_PREFIXES = (_env.PREFIX,)  # every control variable (_env.VARS) and every setting's variable
_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_PATH", "CUDA_HOME", "CUDA_MODULE_LOADING", "TORCH_CUDA_ARCH_LIST")


@dataclass
class Check:
    name: str
    status: str  # OK | WARN | FAIL | INFO
    detail: str
    fix: str = ""


@dataclass
class Report:
    versions: dict[str, str | None] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    paths: dict[str, str | None] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _torch() -> tuple[str | None, str | None]:
    """torch's version and the CUDA it was built for (``None`` for a CPU build), importing torch as
    collect_env does; ``(None, None)`` when torch is not installed."""
    from ._entrypoints import installed_version

    if installed_version("torch") is None:
        return None, None
    try:
        import torch

        return str(torch.__version__), torch.version.cuda
    except Exception as exc:  # noqa: BLE001 - a broken torch is part of the report
        return f"{installed_version('torch')} (import failed: {type(exc).__name__}: {exc})", None


def collect() -> Report:
    """The whole report, its ``checks`` included (FAIL only for what compiling or running kernels needs and is broken)."""
    from . import __version__, kernels
    from ._entrypoints import find_entry_points, installed_version
    from .profiles import detect
    from .registry import ENTRY_POINT_GROUP

    r = Report()
    v = r.versions
    v["hwprofile"] = __version__
    v["python"] = sys.version.split()[0]
    v["os"] = f"{platform.system()} {platform.release()} ({platform.machine()})"
    for ep in sorted(find_entry_points(ENTRY_POINT_GROUP), key=lambda e: e.name):
        v[f"plugin {ep.name}"] = f"{ep.distribution} {ep.version}"
    torch_version, torch_cuda = _torch()
    v["torch"] = torch_version
    v["torch CUDA"] = torch_cuda
    for w in _WHEELS:
        found = installed_version(w)
        if found is not None:
            v[w] = found
    try:
        nv = kernels.nvrtc_version()
        v["nvrtc"] = f"{nv[0]}.{nv[1]}"
    except Exception as exc:  # noqa: BLE001 - reported by the checks
        nv = None
        v["nvrtc"] = f"not usable ({exc})"
    r.environment = {k: val for k, val in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES}
    det = detect()
    r.devices = [d.as_dict() for d in det.devices]
    real = [d for d in det.devices if not d.simulated]
    if real:
        v["driver"] = real[0].driver_version
        cdv = real[0].cuda_driver_version
        v["driver CUDA"] = f"{cdv[0]}.{cdv[1]}" if cdv else None
    r.paths = _paths(det)
    r.checks = _checks(det, nv, torch_cuda)
    return r


def _paths(det: Any) -> dict[str, str | None]:
    from . import kernels, tuning

    out: dict[str, str | None] = {}
    try:
        off = "" if kernels.cache_enabled() else f" (disabled by {_env.CACHE.name})"
        out["kernel cache"] = f"{kernels.cache_dir(create=False)}{off}"
    except Exception as exc:  # noqa: BLE001 - a refused cache dir is part of the report
        out["kernel cache"] = f"unusable: {exc}"
    out["config"] = tuning.config_dir(os.environ)
    for d in det.devices:
        out[f"tuned files, device {d.index}"] = str(tuning.tuned_dir(d, os.environ))
    try:
        out["cuda headers"] = kernels.cuda_headers()[0]
    except Exception as exc:  # noqa: BLE001
        out["cuda headers"] = f"not found ({exc})"
    return out


def _checks(det: Any, nv: tuple[int, int] | None, torch_cuda: str | None) -> list[Check]:
    """FAIL only for what compiling or running kernels needs and is broken."""
    from . import kernels

    out: list[Check] = []
    if det.devices:
        names = ", ".join(f"{d.index}: {d.name} ({d.sm}{', simulated' if d.simulated else ''})" for d in det.devices)
        out.append(
            Check("devices", "INFO" if det.simulated else "OK", names + (f" [simulated by {_env.DEVICE.name}]" if det.simulated else ""))
        )
    else:
        out.append(Check("devices", "INFO", f"no NVIDIA GPU ({det.reason}); compile-only use and simulation still work"))
    out.append(_cache_check())
    from ._entrypoints import installed_version

    bindings = installed_version("cuda-bindings")
    if bindings is not None:
        out.append(Check("cuda-python", "OK", f"cuda-bindings {bindings}"))
    else:
        out.append(
            Check(
                "cuda-python",
                "FAIL",
                "cuda-bindings is not installed",
                "pip install 'hwprofile[cu13]' (CUDA 13 driver, 580+) or 'hwprofile[cu12]'",
            )
        )
        return out
    if nv is None:
        out.append(Check("nvrtc", "FAIL", "NVRTC is not usable", "pip install 'hwprofile[cu13]' (nvidia-cuda-nvrtc) or 'hwprofile[cu12]'"))
        return out
    out.append(Check("nvrtc", "OK", f"NVRTC {nv[0]}.{nv[1]}, targets sm_{', sm_'.join(map(str, kernels.nvrtc_archs()))}"))
    cudart, problem = kernels.cuda_headers()
    if problem:
        out.append(Check("headers", "FAIL", problem, f"pip install 'hwprofile[cu{nv[0]}]'"))
    elif cudart and all(os.path.isfile(os.path.join(cudart, h)) for h in ("cuda_bf16.h", "cuda_fp8.h")):
        out.append(Check("headers", "OK", f"CUDA {nv[0]} headers (cuda_bf16.h, cuda_fp8.h) in {cudart}"))
    else:
        out.append(Check("headers", "FAIL", f"cuda_bf16.h or cuda_fp8.h missing from {cudart}", f"pip install 'hwprofile[cu{nv[0]}]'"))
    real = [d for d in det.devices if not d.simulated]
    if real:
        problem = kernels.check_driver_for_nvrtc(real[0].cuda_driver_version)
        out.append(
            Check(
                "nvrtc vs driver",
                "FAIL" if problem else "OK",
                problem or "cubins from this NVRTC load on this driver",
                "see detail" if problem else "",
            )
        )
    if torch_cuda:
        tmajor = torch_cuda.split(".")[0]
        if tmajor.isdigit() and int(tmajor) != nv[0]:
            out.append(
                Check(
                    "torch vs nvrtc",
                    "WARN",
                    f"torch is built for CUDA {torch_cuda} but NVRTC is CUDA {nv[0]}.{nv[1]}: the kernels need a driver for CUDA {nv[0]}, "
                    "and two CUDA runtimes share the process",
                    f"install the extra matching torch: pip install 'hwprofile[cu{tmajor}]'",
                )
            )
        else:
            out.append(Check("torch vs nvrtc", "OK", f"torch CUDA {torch_cuda}, NVRTC {nv[0]}.{nv[1]}"))
    return out


def _cache_check() -> Check:
    """The kernel cache: a directory the cache refuses (shared, foreign, a link, not a directory) makes
    every kernel load fail, so it is a FAIL; an absent one is created on the first compile."""
    from . import kernels
    from .errors import CacheError

    if not kernels.cache_enabled():
        return Check("kernel cache", "INFO", f"disabled by {_env.CACHE.name}: every process compiles its kernels")
    try:
        path = kernels.cache_dir(create=False)
    except CacheError as exc:
        return Check("kernel cache", "FAIL", str(exc), "see detail")
    return Check("kernel cache", "OK", f"{path}{'' if path.is_dir() else ' (created on the first compile)'}")


def render(r: Report) -> str:
    """The report as text, collect-env style."""
    width = max(len(k) for k in [*r.versions, *r.paths, "x"]) + 2
    lines = ["versions:"]
    lines += [f"  {k:<{width}}{val if val is not None else '-'}" for k, val in r.versions.items()]
    lines += ["environment:"] + ([f"  {k}={val}" for k, val in r.environment.items()] or [f"  (no {_env.PREFIX}* or CUDA_* variable set)"])
    lines += ["paths:"] + [f"  {k:<{width}}{val if val is not None else '-'}" for k, val in r.paths.items()]
    lines += ["checks:"]
    for c in r.checks:
        lines.append(f"  [{c.status:>4}] {c.name}: {c.detail}" + (f"\n         fix: {c.fix}" if c.fix else ""))
    return "\n".join(lines)
