"""``hwprofile doctor``: the environment report a bug needs (as ``torch.utils.collect_env`` and
``vllm collect-env`` give), for what hwprofile touches, then checks.

* **versions**: Python, OS, hwprofile and each plugin, torch and its CUDA, cuda-bindings, NVRTC,
  the NVIDIA wheels, the driver. torch's are read from its files (``torch/version.py`` as text,
  its dist-info), never by importing it: an import costs seconds and prints torch's own warnings.
* **environment**: every variable set whose name starts with ``HWPROFILE_``, ``CUDA_``, ``NCCL_``,
  ``TORCH_``, ``PYTORCH_``, ``CUBLAS``, ``CUDNN_`` or ``NVIDIA_``, ``LD_LIBRARY_PATH``, and every
  variable an installed plugin exports as an env default; a value whose name looks secret is redacted.
* **env defaults**: each variable the plugins' ``hwprofile_env_defaults`` propose, whether it is set,
  and what the plugin would set (per device; with no device, per installed target).
* **paths**, **devices** (name, capability, selected plugin, NVRTC target, profile fingerprint;
  simulated ones marked), and **checks**, each failure with its fix.

Reading the report never fails: what cannot be read is reported as such. A missing dependency (pluggy,
nvidia-ml-py, cuda-bindings, the NVRTC library: ``hwprofile._deps``) is a check naming the package and its install
command, and the rest is still read: the plugins from their entry points, and without NVML the CUDA driver's view
(cuda-bindings) and torch's (asked in a child process). Never imports torch and
never creates a CUDA context. :data:`FORMAT` versions the JSON (``hwprofile doctor --json``): keys are
only ever added under one format number.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _deps, _env
from ._install import hwprofile_extra
from ._redact import redact
from .errors import HwprofileError

#: Version of ``hwprofile doctor --json``'s layout (the ``format`` key).
FORMAT = 1

_WHEELS = (
    "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime",
    "nvidia-cuda-runtime-cu12", "nvidia-cublas", "nvidia-cublas-cu12", "nvidia-ml-py", "pluggy",
)
#: Variables reported by prefix: hwprofile's own (every control variable and setting's), then what
#: CUDA, NCCL, torch, cuBLAS / cuDNN and the NVIDIA container runtime read (collect_env's list).
ENV_PREFIXES = (_env.PREFIX, "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "CUBLAS", "CUDNN_", "NVIDIA_")
ENV_NAMES = ("LD_LIBRARY_PATH",)
_SECRET = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "API_KEY", "CREDENTIAL", "PRIVATE_KEY")
REDACTED = "<redacted>"
_LONG = 100  # text output cuts longer values (the JSON keeps them)
#: The engine's profile() fails the same way: change or unset what the error names, then this repeats it.
_FIX_PROFILE = (
    f"change or unset the variable the error names, or update or disable ({_env.DISABLE_PLUGINS.name}=<name>) the plugin "
    "it names; check again with: hwprofile"
)


@dataclass
class Check:
    name: str
    status: str  # OK | WARN | FAIL | INFO
    detail: str
    fix: str = ""


@dataclass
class Report:
    format: int = FORMAT
    versions: dict[str, str | None] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    env_defaults: list[dict[str, Any]] = field(default_factory=list)
    paths: dict[str, str | None] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == "FAIL" for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_ASSIGN = re.compile(r"""^(\w+)\s*(?::[^=]*)?=\s*(?:'([^'\\]*)'|"([^"\\]*)"|(None))\s*$""")


def torch_versions() -> tuple[str | None, str | None]:
    """torch's version and the CUDA it was built for (``None`` for a CPU build), without importing torch.

    A torch the process already imported is asked directly; otherwise ``torch/version.py`` of the
    torch that ``import torch`` would find is read as text (its ``__version__`` and ``cuda`` lines),
    and its dist-info's version stands in when that file is missing. ``(None, None)``: not installed.
    """
    mod = sys.modules.get("torch")
    if mod is not None:
        try:
            return str(mod.__version__), getattr(mod.version, "cuda", None)
        except Exception:  # noqa: BLE001 - a half-imported torch: read its files instead
            pass
    from ._entrypoints import installed_version, package_file

    dist = installed_version("torch")
    path = package_file("torch", "version.py")
    if path is None:
        return (f"{dist} (no torch package on sys.path: reinstall torch)" if dist else None), None
    found: dict[str, str | None] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = _ASSIGN.match(line.strip())
                if m is not None and m.group(1) in ("__version__", "cuda"):
                    found[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
    except OSError as exc:
        return f"{dist or '?'} (cannot read {path}: {exc.strerror})", None
    return found.get("__version__") or dist, found.get("cuda")


def _environment(extra: set[str]) -> dict[str, str]:
    """The variables that change what hwprofile, CUDA, NCCL or torch do, with secret-looking values redacted."""
    out = {}
    for k, v in sorted(os.environ.items()):
        if k.startswith(ENV_PREFIXES) or k in ENV_NAMES or k in extra:
            out[k] = REDACTED if any(t in k.upper() for t in _SECRET) else redact(v)  # a URL's password, a remembered secret
    return out


def collect() -> Report:
    """The whole report, its ``checks`` included (FAIL only for what compiling or running kernels needs and is broken)."""
    from . import kernels
    from ._entrypoints import ENTRY_POINT_GROUP, find_entry_points, installed_version, natural_key
    from ._version import __version__
    from .profiles import detect

    r = Report()
    v = r.versions
    v["hwprofile"] = __version__
    v["python"] = sys.version.split()[0]
    v["os"] = f"{platform.system()} {platform.release()} ({platform.machine()})"
    for ep in sorted(find_entry_points(ENTRY_POINT_GROUP), key=lambda e: natural_key(e.name)):
        v[f"plugin {ep.name}"] = f"{ep.distribution} {ep.version}"
    torch_version, torch_cuda = torch_versions()
    v["torch"] = torch_version
    v["torch CUDA"] = torch_cuda
    for w in _WHEELS:
        found = installed_version(w)
        if found is not None:
            v[w] = found
    nvrtc_problem = ""
    try:
        nv = kernels.nvrtc_version()
        v["nvrtc"] = f"{nv[0]}.{nv[1]}"
    except Exception as exc:  # noqa: BLE001 - reported by the checks
        nv = None
        nvrtc_problem = _error_text(exc)
        v["nvrtc"] = f"not usable ({exc})"
    detect_failed = None
    try:
        det = detect()
    except Exception as exc:  # noqa: BLE001 - a refused HWPROFILE_DEVICE (or a broken NVML) must not hide the rest
        from .device import Detection

        det = Detection((), f"detection failed: {_error_text(exc)}")
        var = _env.DEVICE.name
        fix = f"unset {var} or set it to a name 'hwprofile devices' lists" if var in os.environ else "see detail"
        detect_failed = Check("devices", "FAIL", _error_text(exc), fix)
    real = [d for d in det.devices if not d.simulated]
    if real:
        v["driver"] = real[0].driver_version
        cdv = real[0].cuda_driver_version
        v["driver CUDA"] = f"{cdv[0]}.{cdv[1]}" if cdv else None
    profiles, problems = _profiles(det, r)
    r.env_defaults = _env_defaults(profiles)
    r.environment = _environment({e["name"] for e in r.env_defaults})
    r.paths = _paths(det)
    r.checks = _checks(det, nv, torch_cuda, nvrtc_problem)
    if detect_failed is not None:
        r.checks[0] = detect_failed
    r.checks[1:1] = [*_dependencies(r), *problems]  # right after the devices check
    return r


def _dependencies(r: Report) -> list[Check]:
    """pluggy or nvidia-ml-py not installed: a FAIL naming it with its install command, and what can be read
    without it (the plugins from their entry points, in ``versions``; without NVML, the CUDA driver's and torch's
    view of the devices). cuda-bindings and NVRTC have checks of their own (:func:`_checks`)."""
    out = []
    dep = _deps.absent("pluggy")
    if dep is not None:
        out.append(Check(dep.distribution, "FAIL", _deps.text(dep, "no profile can be resolved; the plugins in versions are "
                                                                "read from their entry points, not loaded"), dep.install))
    dep = _deps.absent("pynvml")
    if dep is not None:
        driver, cuda, n_driver = _driver_view()
        if cuda is not None and r.versions.get("driver CUDA") is None:
            r.versions["driver CUDA"] = cuda
        torch_view, n_torch = _torch_view()
        sees = max(n_driver, n_torch)
        why = f"the CUDA driver or torch sees {sees} GPU{'' if sees == 1 else 's'}, below" if sees else ""
        out.append(Check(dep.distribution, "FAIL" if sees else "WARN", _deps.text(dep, why), dep.install))
        out += [Check("cuda driver", "INFO", driver), Check("torch", "INFO", torch_view)]
    return out


def _driver_view() -> tuple[str, str | None, int]:
    """The CUDA driver's view through cuda-bindings (no NVML, no context: cuInit and device queries only):
    (text, driver CUDA version, number of devices)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return f"not read: {_deps.text(_deps.DEPENDENCIES['cuda'])}", None, 0
    ok = cu.CUresult.CUDA_SUCCESS
    try:
        err, v = cu.cuDriverGetVersion()
        if err != ok:
            return f"no CUDA driver ({err.name})", None, 0
        cuda = f"{v // 1000}.{v % 1000 // 10}"
        (err,) = cu.cuInit(0)
        err, n = cu.cuDeviceGetCount() if err == ok else (err, 0)
        if err != ok:
            return f"CUDA driver {cuda}, no usable device ({err.name})", cuda, 0
        attr = cu.CUdevice_attribute
        cc = (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        devices = []
        for i in range(n):
            _, dev = cu.cuDeviceGet(i)
            _, name = cu.cuDeviceGetName(96, dev)
            major, minor = (cu.cuDeviceGetAttribute(which, dev)[1] for which in cc)
            devices.append(f"{i} {name.split(bytes(1))[0].decode(errors='replace')} ({major}.{minor})")
        return f"CUDA driver {cuda}, {n} device{'' if n == 1 else 's'}{': ' if devices else ''}{', '.join(devices)}", cuda, n
    except Exception as exc:  # noqa: BLE001 - no driver library (cuda.pathfinder's DynamicLibNotFoundError), or an odd one
        return f"no CUDA driver ({type(exc).__name__}: {exc})", None, 0


#: torch's view, asked in a child process: importing torch here costs seconds and prints torch's warnings
_TORCH_VIEW = (
    "import json, torch; c = torch.cuda; n = c.device_count() if c.is_available() else 0; "
    "print(json.dumps([torch.__version__, [f'{i} {c.get_device_name(i)} ({\"%d.%d\" % c.get_device_capability(i)})' for i in range(n)]]))"
)


def _torch_view() -> tuple[str, int]:
    """What ``torch.cuda`` sees (a child process; only where NVML cannot look): (text, number of devices)."""
    import json
    import subprocess

    if torch_versions()[0] is None:
        return "torch is not installed", 0
    try:
        run = subprocess.run([sys.executable, "-c", _TORCH_VIEW], capture_output=True, text=True, timeout=120)
        version, devices = json.loads(run.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return "torch could not be asked (import torch failed in a child process)", 0
    n = len(devices)
    return f"torch {version} sees {n} CUDA device{'' if n == 1 else 's'}{': ' if devices else ''}{', '.join(devices)}", n


def _profiles(det: Any, r: Report) -> tuple[list[tuple[int | None, str | None, Any]], list[Check]]:
    """Each device's row of :attr:`Report.devices` (its profile: plugin, target, fingerprint), and the
    profiles whose env defaults are reported: the devices', or with no device one simulated device
    per installed target. A profile that cannot be resolved is a FAIL: the engine's would fail too."""
    from .profiles import profile

    out: list[tuple[int | None, str | None, Any]] = []
    problems: list[Check] = []
    unloadable = _deps.absent("pluggy")  # reported once by _dependencies, not per device
    for d in det.devices:
        row = {**d.as_dict(), "plugin": None, "plugin_distribution": None, "plugin_version": None, "target": None, "fingerprint": None,
               "tuned_dir": _tuned_dir(d), "error": None, "selftest": None, "verification": None}
        r.devices.append(row)
        if unloadable is not None:
            row["error"] = _deps.text(unloadable)
            continue
        try:
            prof = profile(d.index)
        except Exception as exc:  # noqa: BLE001 - the report names it; the engine would get the same error
            row["error"] = _error_text(exc)
            problems.append(Check(f"profile, device {d.index}", "FAIL", row["error"], _FIX_PROFILE + f" show --device {d.index}"))
            continue
        p = prof.plugin
        row.update(plugin=p.name if p else None, plugin_distribution=p.distribution if p else None,
                   plugin_version=p.version if p else None, target=prof.target, fingerprint=prof.fingerprint)
        out.append((d.index, prof.target, prof))
        row["selftest"] = _selftest(prof)
        from . import _verdicts

        row["verification"] = _verdicts.summary(prof) if prof.kernels else None
    if det.devices or unloadable is not None:
        return out, problems
    from ._entrypoints import natural_key
    from .device import DeviceInfo
    from .profiles import build_profile, registry

    try:
        reg = registry()
    except Exception as exc:  # noqa: BLE001 - a broken plugin: reported, the rest still is
        problems.append(Check("plugins", "FAIL", _error_text(exc), _FIX_PROFILE + " plugins"))
        return out, problems
    seen: set[str] = set()
    for p in sorted(reg.arch_plugins, key=lambda p: natural_key(p.name)):
        assert p.arch is not None
        for cc, target in p.arch.targets.items():
            info = DeviceInfo(0, f"compile-only {target}", cc, simulated=True)
            try:
                out.append((None, target, build_profile(info, reg, os.environ)))
            except Exception as exc:  # noqa: BLE001 - a variable or plugin every profile refuses: reported once
                text = _error_text(exc)
                if text not in seen:
                    seen.add(text)
                    problems.append(Check(f"profile for {target}", "FAIL", text, _FIX_PROFILE + f" show --simulate {info.sm}"))
    return out, problems


def _selftest(prof: Any) -> list[dict[str, Any]] | None:
    """The stored self-test verdicts of a real device's kernels, per op (None for a simulated device: nothing ran there)."""
    from . import selftest

    if not selftest.on_gpu(prof) or not prof.kernels:
        return None

    try:
        return selftest.summary(prof)
    except Exception as exc:  # noqa: BLE001 - an unreadable verdict file must not hide the rest of the report
        return [{"op": "-", "state": f"cannot read the verdicts: {_error_text(exc)}", "passed": 0, "failed": 0, "unchecked": 0}]


def _error_text(exc: BaseException) -> str:
    dep = _deps.missing(exc)
    return str(exc) if isinstance(exc, HwprofileError) else str(dep) if dep else f"{type(exc).__name__}: {exc}"


def _env_defaults(profiles: list[tuple[int | None, str | None, Any]]) -> list[dict[str, Any]]:
    """One entry per variable a plugin proposes: whether the user set it (and to what), and what each
    profile's plugins would set (``Profile.apply_env`` writes only the unset ones)."""
    by_name: dict[str, dict[str, Any]] = {}
    for index, target, prof in profiles:
        names = {p.source: p.name for p in (*prof.participants, *([prof.plugin] if prof.plugin else []))}
        for name, d in prof.env_defaults.items():
            user = os.environ.get(name)
            secret = any(t in name.upper() for t in _SECRET)
            e = by_name.setdefault(name, {"name": name, "set": user is not None,
                                          "value": REDACTED if secret and user is not None else user, "defaults": []})
            e["defaults"].append({"device": index, "target": target, "value": REDACTED if secret else d.value,
                                  "plugin": names.get(d.source, d.source), "from": d.source, "reason": d.reason,
                                  "bit_identical": d.bit_identical})
    return [by_name[n] for n in sorted(by_name)]


def _paths(det: Any) -> dict[str, str | None]:
    from . import kernels, tuning

    out: dict[str, str | None] = {}
    try:
        off = "" if kernels.cache_enabled() else f" (disabled by {_env.CACHE.name})"
        out["kernel cache"] = f"{kernels.cache_dir(create=False)}{off}"
    except Exception as exc:  # noqa: BLE001 - a refused cache dir is part of the report
        out["kernel cache"] = f"unusable: {exc}"
    try:
        out["config"] = tuning.config_dir(os.environ)
    except HwprofileError as exc:  # no home and no HWPROFILE_CONFIG_DIR: no tuned directory is read
        out["config"] = f"none: {exc}"
    for d in det.devices:
        out[f"tuned files, device {d.index}"] = _tuned_dir(d)
    try:
        out["cuda headers"] = kernels.cuda_headers()[0]
    except Exception as exc:  # noqa: BLE001
        out["cuda headers"] = f"not found ({exc})"
    return out


def _tuned_dir(d: Any) -> str | None:
    """The device's tuned directory, or ``None`` when there is no config dir (the ``config`` path says why)."""
    from . import tuning

    try:
        return str(tuning.tuned_dir(d, os.environ))
    except HwprofileError:
        return None


def _checks(det: Any, nv: tuple[int, int] | None, torch_cuda: str | None, nvrtc_problem: str = "") -> list[Check]:
    """FAIL only for what compiling or running kernels needs and is broken."""
    from . import kernels

    out: list[Check] = []
    n = len(det.devices)
    if det.devices and det.simulated:
        var = _env.DEVICE.name
        what = f"{n} device{'s' if n > 1 else ''} simulated by {var}={os.environ.get(var, '')}"
        out.append(Check("devices", "INFO", f"{what}: settings, env defaults and compiling only, kernels cannot run"))
    elif det.devices:
        out.append(Check("devices", "OK", f"{n} NVIDIA GPU{'s' if n > 1 else ''} visible"))
    else:
        out.append(Check("devices", "INFO", f"no NVIDIA GPU ({det.reason}); compile-only use and simulation still work "
                                            f"({_env.DEVICE.name}=h200 hwprofile doctor shows a simulated one)"))
    out.append(_cache_check())
    out += _remote_check()
    from ._entrypoints import installed_version

    bindings = installed_version("cuda-bindings")
    if bindings is not None:
        out.append(Check("cuda-python", "OK", f"cuda-bindings {bindings}"))
    else:
        dep = _deps.DEPENDENCIES["cuda"]
        out.append(Check("cuda-python", "FAIL", _deps.text(dep), dep.install))
        return out
    if nv is None:
        out.append(Check("nvrtc", "FAIL", f"NVRTC is not usable: {nvrtc_problem}", _deps.NVRTC.install))
        return out
    out.append(Check("nvrtc", "OK", f"NVRTC {nv[0]}.{nv[1]}, targets sm_{', sm_'.join(map(str, kernels.nvrtc_archs()))}"))
    cudart, problem = kernels.cuda_headers()
    if problem:
        out.append(Check("headers", "FAIL", problem, hwprofile_extra(f"cu{nv[0]}")))
    elif cudart and all(os.path.isfile(os.path.join(cudart, h)) for h in ("cuda_bf16.h", "cuda_fp8.h")):
        out.append(Check("headers", "OK", f"CUDA {nv[0]} headers (cuda_bf16.h, cuda_fp8.h) in {cudart}"))
    else:
        out.append(Check("headers", "FAIL", f"cuda_bf16.h or cuda_fp8.h missing from {cudart}", hwprofile_extra(f"cu{nv[0]}")))
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
                    f"install the extra matching torch: {hwprofile_extra(f'cu{tmajor}')}",
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
    if path.is_dir():
        return Check("kernel cache", "OK", str(path))
    probe = path.parent
    while not os.path.lexists(probe) and probe != probe.parent:  # the nearest existing ancestor decides
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):  # a read-only HOME or file system
        return Check(
            "kernel cache", "WARN",
            f"{path} does not exist and cannot be created ({probe} is not writable): kernels run uncached, "
            "each process compiles them again",
            f"set {_env.CACHE_DIR.name} to a private directory you can write",
        )
    return Check("kernel cache", "OK", f"{path} (created on the first compile)")


def _remote_check() -> list[Check]:
    """The fleet store, when ``HWPROFILE_REMOTE`` names one: pinged once (bounded); a store that does not answer
    is a WARN (kernels and tuned tables then stay local), never a FAIL."""
    from . import _remote

    try:
        url = _remote.configured()
    except HwprofileError as exc:
        return [Check("remote store", "FAIL", str(exc), f"fix or unset {_env.REMOTE.name}")]
    if url is None:
        return []
    shown = redact(url)
    store = _remote.store()
    if store is None:
        why = (_remote.status() or {}).get("state", "not used")
        return [Check("remote store", "WARN", f"{shown}: {why}", _remote.install() if "redis package" in why else "see detail")]
    try:
        pong = store.ping()
    except Exception as exc:  # noqa: BLE001 - any fault of the store or its client is the finding
        return [Check("remote store", "WARN", f"{shown} does not answer within {store.timeout_s:g} s ({type(exc).__name__}: {exc}): "
                      "kernels and tuned tables stay local", f"start the server, or fix or unset {_env.REMOTE.name}")]
    st = _remote.status() or {}
    return [Check("remote store", "OK", f"{shown}: Redis {pong['version']}, {pong['ms']} ms round trip; {_remote.describe(st)}")]


def _short(value: str, limit: int = _LONG) -> str:
    return value if len(value) <= limit else f"{value[:limit - 30]}... ({len(value)} chars; --json has all)"


def _grouped(defaults: list[dict[str, Any]]) -> str:
    """``9.0a`` when every profile agrees, else ``9.0a (sm_90a), 10.0a (sm_100a, sm_103a)``."""
    groups: dict[str, list[str]] = {}
    for x in defaults:
        where = f"device {x['device']}" if x["device"] is not None else str(x["target"])
        groups.setdefault(x["value"], []).append(where)
    if len(groups) == 1:
        return next(iter(groups))
    return ", ".join(f"{val} ({', '.join(w)})" for val, w in groups.items())


def render(r: Report) -> str:
    """The report as text, collect-env style, one screen for one host."""
    from ._entrypoints import natural_key

    tuned = {k: val for k, val in r.paths.items() if k.startswith("tuned files")}
    paths = {k: val for k, val in r.paths.items() if k not in tuned}
    if len(set(tuned.values())) == 1 and len(tuned) > 1:
        paths["tuned files, every device"] = next(iter(tuned.values()))
    else:
        paths.update(tuned)
    width = max(len(k) for k in [*r.versions, *paths, "x"]) + 2
    lines = ["versions:"]
    lines += [f"  {k:<{width}}{val if val is not None else '-'}" for k, val in r.versions.items()]
    lines += ["environment:"]
    none = f"  (none of {'*, '.join(ENV_PREFIXES)}*, {', '.join(ENV_NAMES)} is set)"
    lines += [f"  {k}={_short(val, max(60, _LONG - len(k)))}" for k, val in r.environment.items()] or [none]
    sim = any(x["device"] is None for e in r.env_defaults for x in e["defaults"])
    lines += [f"env defaults ({'no device: per installed target, ' if sim else ''}what the plugins would set; "
              "apply_env() leaves set variables alone):"]
    if r.env_defaults:
        w = max(len(e["name"]) for e in r.env_defaults) + 2
        for e in r.env_defaults:
            state = f"set to {_short(e['value'])!r}, kept; plugin value" if e["set"] else "unset, would set"
            plugins = ", ".join(sorted({x["plugin"] for x in e["defaults"]}, key=natural_key))
            lines.append(f"  {e['name']:<{w}}{state} {_grouped(e['defaults'])}  [from {plugins}]")
    else:
        lines.append("  (no installed plugin proposes one)")
    lines += ["paths:"] + [f"  {k:<{width}}{val if val is not None else '-'}" for k, val in paths.items()]
    lines += ["devices (fingerprint: hash of plugin, target, settings, env defaults, kernels; equal: same dispatch):"]
    rows = []
    for d in r.devices:
        cc = d["compute_capability"]
        row = [str(d["index"]), d["name"], f"{cc[0]}.{cc[1]} {d['sm']}{', simulated' if d['simulated'] else ''}"]
        if d["error"]:
            rows.append([*row, "profile error (see checks)"])
        else:
            rows.append([*row, f"plugin {d['plugin'] or 'none'}", f"target {d['target'] or '-'}", f"fingerprint {d['fingerprint']}"])
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(map(len, rows), default=0))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    if not r.devices:
        lines.append("  none visible (see checks)")
    verdicts = [(d["index"], v) for d in r.devices for v in d.get("selftest") or ()]
    if verdicts:
        lines += ["self-test verdicts (hwprofile selftest; stamped per device, driver, plugin, kernel and plan):"]
        lines += [f"  cuda:{i} {v['op']}: {v['state']}" for i, v in verdicts]
    for d in r.devices:  # kernels verified against float64 on first use (once per device, driver, plugin, kernel and plan)
        if d.get("verification"):
            from ._verdicts import summary_text

            rows_v = d["verification"].items()
            lines.append(f"  cuda:{d['index']} kernels verified on first use: " + "; ".join(f"{op} {summary_text(v)}" for op, v in rows_v))
            lines += [f"    {op}: {v['first_failure']}" for op, v in rows_v if v["first_failure"]]
    lines += ["checks:"]
    for c in r.checks:
        lines.append(f"  [{c.status:>4}] {c.name}: {c.detail}" + (f"\n         fix: {c.fix}" if c.fix else ""))
    return "\n".join(lines)
