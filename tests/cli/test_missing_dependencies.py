"""A missing dependency (pluggy, nvidia-ml-py, cuda-bindings, the NVRTC library) is an installation problem: every
command says so in one line naming the package and the command that installs it, never a traceback or "internal
error ... This is a bug"; ``doctor`` reports it as a finding and everything it can read without it.

Each command runs in a child process whose ``sitecustomize`` makes the module unimportable (``sys.modules[name] =
None``, what an uninstalled package looks like to ``import``), or makes cuda-pathfinder fail to find libnvrtc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import _deps, doctor
from hwprofile.errors import MissingDependencyError

BLOCK = """import sys
for name in {names!r}:
    sys.modules[name] = None
"""
NO_NVRTC = """import cuda.pathfinder as p
_real = p.load_nvidia_dynamic_lib
def _load(name, *a, **k):
    if name == "nvrtc":
        raise p.DynamicLibNotFoundError("Failure finding libnvrtc.so (hidden by the test)")
    return _real(name, *a, **k)
p.load_nvidia_dynamic_lib = _load
"""
CUDA = ("cuda", "cuda.bindings", "cuda.bindings.nvrtc", "cuda.bindings.driver")
CUDA_INSTALL = _deps.cuda_extra()  # from where hwprofile came, never by bare name


def hw(tmp_path: Path, site: str, *args: str, device: str | None = None) -> subprocess.CompletedProcess[str]:
    """``hwprofile ARGS`` in a child whose sitecustomize is ``site``, simulating ``device`` (none: no GPU here)."""
    d = tmp_path / "site"
    d.mkdir(exist_ok=True)
    (d / "sitecustomize.py").write_text(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(PYTHONPATH=os.pathsep.join([str(d), *filter(None, [env.get("PYTHONPATH")])]), HWPROFILE_CACHE_DIR=str(tmp_path / "cache"),
               HWPROFILE_CONFIG_DIR=str(tmp_path / "config"), CUDA_VISIBLE_DEVICES="")
    if device is not None:
        env["HWPROFILE_DEVICE"] = device
    cmd = [sys.executable, "-m", "hwprofile.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def one_line(p: subprocess.CompletedProcess[str], package: str, install: str) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    line = lines[0]
    assert line.startswith("hwprofile: error: ") and package in line and install in line, line
    assert "Traceback" not in p.stderr and "internal error" not in line and "bug" not in line
    return line


@pytest.mark.parametrize(
    "args",
    [["show"], ["plugins"], ["explain", "gemv.max_k"], ["env"], ["selftest"], ["compile", "--arch", "sm_90a"], ["devices"], ["tune"],
     ["new-plugin", "sm89", "--capability", "8.9", "--dir", "x"], ["cache"]],
    ids=lambda a: a[0],
)
def test_without_pluggy_every_command_names_it(tmp_path: Path, args: list[str]) -> None:
    p = hw(tmp_path, BLOCK.format(names=("pluggy",)), *args, device="h200")
    if p.returncode == 0:  # a command that loads no plugin works (the built-in catalog, the cache's entries, a scaffold)
        assert args[0] in ("devices", "cache", "new-plugin"), (args, p.stdout)
        return
    line = one_line(p, "pluggy", "pip install 'pluggy")
    assert "not installed" in line


@pytest.mark.parametrize("args", [["show"], ["selftest"], ["explain", "gemv.max_k"], ["env"]], ids=lambda a: a[0])
def test_without_nvidia_ml_py_a_report_names_it(tmp_path: Path, args: list[str]) -> None:
    one_line(hw(tmp_path, BLOCK.format(names=("pynvml",)), *args), "nvidia-ml-py", "pip install nvidia-ml-py")


def test_compile_without_cuda_bindings_or_nvrtc_names_them(tmp_path: Path) -> None:
    one_line(hw(tmp_path, BLOCK.format(names=CUDA), "compile", "--arch", "sm_90a"), "cuda-bindings", CUDA_INSTALL)
    line = one_line(hw(tmp_path, NO_NVRTC, "compile", "--arch", "sm_90a"), "nvidia-cuda-nvrtc", CUDA_INSTALL)
    assert "libnvrtc" in line


def checks(p: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert "Traceback" not in p.stderr, p.stderr
    report = json.loads(p.stdout)
    assert {f"plugin {n}" for n in ("sm90", "sm100", "sm120")} <= set(report["versions"]), "the plugins are reported"
    return {c["name"]: c for c in report["checks"]}


def test_doctor_without_pluggy_reports_the_rest(tmp_path: Path) -> None:
    p = hw(tmp_path, BLOCK.format(names=("pluggy",)), "doctor", "--json")
    found = checks(p)
    assert p.returncode == 1 and found["pluggy"]["status"] == "FAIL" and found["pluggy"]["fix"].startswith("pip install 'pluggy")
    assert found["nvrtc"]["status"] == "OK" and found["kernel cache"]["status"] == "OK"
    assert not [c for c in found if c.startswith(("profile", "plugins"))], "one finding, not one per device or target"


def test_doctor_without_nvidia_ml_py_reports_the_driver_and_torch(tmp_path: Path) -> None:
    p = hw(tmp_path, BLOCK.format(names=("pynvml",)), "doctor", "--json")
    found = checks(p)
    assert found["nvidia-ml-py"]["status"] == "WARN" and found["nvidia-ml-py"]["fix"] == "pip install nvidia-ml-py"  # no GPU here
    assert found["cuda driver"]["status"] == found["torch"]["status"] == "INFO"
    assert found["torch"]["detail"].startswith("torch ") and "sees 0 CUDA devices" in found["torch"]["detail"]
    assert found["nvrtc"]["status"] == "OK"


def test_doctor_without_cuda_bindings_or_nvrtc(tmp_path: Path) -> None:
    found = checks(hw(tmp_path, BLOCK.format(names=CUDA), "doctor", "--json"))
    assert found["nvrtc"]["status"] == "FAIL" and "cuda-bindings is not installed" in found["nvrtc"]["detail"]
    found = checks(hw(tmp_path, NO_NVRTC, "doctor", "--json"))
    assert found["nvrtc"]["status"] == "FAIL" and "nvidia-cuda-nvrtc is not installed" in found["nvrtc"]["detail"]
    assert found["nvrtc"]["fix"].startswith(CUDA_INSTALL)


class FakeDriver:
    """cuda.bindings.driver with one H200 and driver CUDA 13.0, for the GPU machine this test does not have."""

    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)
    CUdevice_attribute = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
                                               CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor")

    def cuDriverGetVersion(self) -> tuple[int, int]:
        return 0, 13000

    def cuInit(self, flags: int) -> tuple[int]:
        return (0,)

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return 0, 1

    def cuDeviceGet(self, i: int) -> tuple[int, int]:
        return 0, i

    def cuDeviceGetName(self, size: int, dev: int) -> tuple[int, bytes]:
        return 0, b"NVIDIA H200" + bytes(size - 11)

    def cuDeviceGetAttribute(self, attr: str, dev: int) -> tuple[int, int]:
        return 0, {"major": 9, "minor": 0}[attr]


def test_doctor_on_a_gpu_machine_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A GPU the CUDA driver and torch see, but hwprofile cannot (no NVML): a FAIL naming the package, and their view."""
    pytest.importorskip("cuda.bindings.driver")  # imported before the fake replaces it (an import later would put it back)
    bindings = sys.modules["cuda.bindings"]
    real_absent = _deps.absent
    monkeypatch.setattr(_deps, "absent", lambda m: _deps.DEPENDENCIES["pynvml"] if m == "pynvml" else real_absent(m))
    monkeypatch.setattr(bindings, "driver", FakeDriver(), raising=False)
    monkeypatch.setattr(doctor, "_torch_view", lambda: ("torch 2.13.0 sees 1 CUDA device: 0 NVIDIA H200 (9.0)", 1))
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # NVML sees nothing, as without nvidia-ml-py
    hwprofile.reset()
    r = doctor.collect()
    found = {c.name: c for c in r.checks}
    assert found["nvidia-ml-py"].status == "FAIL" and "sees 1 GPU" in found["nvidia-ml-py"].detail
    assert found["nvidia-ml-py"].fix == "pip install nvidia-ml-py"
    assert found["cuda driver"].detail == "CUDA driver 13.0, 1 device: 0 NVIDIA H200 (9.0)" and r.versions["driver CUDA"] == "13.0"
    assert "NVIDIA H200" in found["torch"].detail and r.failed
    assert "plugin sm90" in r.versions


def test_missing_names_only_our_dependencies() -> None:
    for module, dist in (("pluggy", "pluggy"), ("pynvml", "nvidia-ml-py"), ("cuda.bindings.nvrtc", "cuda-bindings"),
                         ("cuda.pathfinder", "cuda-pathfinder")):
        err = _deps.missing(ModuleNotFoundError(f"No module named {module!r}", name=module))
        assert isinstance(err, MissingDependencyError) and str(err).startswith(f"{dist} is not installed"), err
    assert _deps.missing(ModuleNotFoundError("No module named 'mine'", name="mine")) is None  # a bug stays a bug
    assert _deps.missing(ValueError("pluggy")) is None


def test_every_dependency_of_core_is_named() -> None:
    """The table covers every distribution core's pyproject depends on (a new one would otherwise be an "internal error")."""
    import re
    import tomllib

    project: dict[str, Any] = tomllib.loads((Path(__file__).parents[2] / "core" / "pyproject.toml").read_text())["project"]
    wanted = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0] for d in project["dependencies"]}
    wanted |= {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0] for d in project["optional-dependencies"]["cu13"]}
    named = {d.distribution for d in _deps.DEPENDENCIES.values()} | {_deps.NVRTC.distribution}
    assert wanted - {"nvidia-cuda-runtime"} <= named, wanted - named
