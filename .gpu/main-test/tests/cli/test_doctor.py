"""``hwprofile doctor``: what ``collect_env`` gives for what hwprofile touches, read without importing torch.

Every test names its devices itself (``HWPROFILE_DEVICE``, or ``CUDA_VISIBLE_DEVICES=""`` for none), so
none depends on the session's device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import doctor
from hwprofile.cli import main

KEYS = {"format", "versions", "environment", "env_defaults", "paths", "devices", "checks"}
DEVICE_KEYS = {"index", "name", "compute_capability", "sm", "simulated", "plugin", "plugin_distribution", "plugin_version", "target",
               "fingerprint", "tuned_dir", "error"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def report(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code, out = run(capsys, "doctor", "--json")
    return code, json.loads(out)


def no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hides every real GPU too
    hwprofile.reset()


def test_doctor_never_imports_torch() -> None:
    """The program, text and JSON: torch (9 s and its NumPy warning on a big install) stays unloaded."""
    code = (
        "import sys, io, contextlib\n"
        "from hwprofile.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['doctor']); main(['doctor', '--json'])\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    env = {**os.environ, "HWPROFILE_DEVICE": "h200,gb300"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]", p.stderr
    env.pop("HWPROFILE_DEVICE")
    env["CUDA_VISIBLE_DEVICES"] = ""  # no device: the per-target profiles must not import it either
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]", p.stderr


def test_torch_versions_match_torch_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.delitem(sys.modules, "torch")  # read its files, as a process without torch does
    assert doctor.torch_versions() == (torch.__version__, torch.version.cuda)


def test_torch_versions_of_a_cuda_build_are_read_as_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('doctor must not import torch')\n")
    (pkg / "version.py").write_text(
        "from typing import Optional\n\n__all__ = ['__version__', 'cuda']\n__version__ = '2.9.1+cu128'\ndebug = False\n"
        "cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n"
    )
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert doctor.torch_versions() == ("2.9.1+cu128", "12.8")
    (pkg / "version.py").write_text("__version__ = \"2.13.0+cpu\"\ncuda: Optional[str] = None\n")
    assert doctor.torch_versions() == ("2.13.0+cpu", None)


def test_json_keys_are_stable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    code, d = report(capsys)
    assert set(d) == KEYS and d["format"] == doctor.FORMAT == 1
    assert list(d) == ["format", "versions", "environment", "env_defaults", "paths", "devices", "checks"]
    assert set(d["devices"][0]) >= DEVICE_KEYS
    for e in d["env_defaults"]:
        assert set(e) == {"name", "set", "value", "defaults"}
        assert all(set(x) == {"device", "target", "value", "plugin", "from", "reason", "bit_identical"} for x in e["defaults"])
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in d["checks"])
    assert code == (1 if any(c["status"] == "FAIL" for c in d["checks"]) else 0)


def test_each_device_names_its_plugin_target_and_fingerprint(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "gb300,l40s")
    _, d = report(capsys)
    gb300, l40s = d["devices"]
    assert (gb300["name"], gb300["compute_capability"], gb300["plugin"], gb300["target"]) == ("NVIDIA GB300", [10, 3], "sm100", "sm_103a")
    assert gb300["plugin_distribution"] == "hwprofile-sm100" and gb300["fingerprint"] == hwprofile.profile(0).fingerprint
    assert (l40s["plugin"], l40s["target"], l40s["error"]) == (None, None, None) and l40s["fingerprint"] == hwprofile.profile(1).fingerprint
    _, out = run(capsys, "doctor")
    devices = out.split("devices (", 1)[1].split("checks:", 1)[0]
    assert "fingerprint: hash of plugin, target, settings" in devices
    assert f"plugin sm100  target sm_103a  fingerprint {gb300['fingerprint']}" in devices
    assert f"plugin none   target -        fingerprint {l40s['fingerprint']}" in devices


def test_environment_lists_what_hwprofile_cuda_nccl_and_torch_read(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    want = {"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_CUDA_ARCH_LIST": "9.0",
            "CUDA_VISIBLE_DEVICES": "0", "CUDA_LAUNCH_BLOCKING": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "MYENGINE_FUSED_SHARED_EXPERTS": "1"}  # the last: a plugin's env default
    for k, v in want.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("NVIDIA_API_KEY", "nvapi-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("SOME_OTHER_TOOL", "x")
    _, d = report(capsys)
    env = d["environment"]
    assert {k: env.get(k) for k in want} == want and env["HWPROFILE_DEVICE"] == "h200"
    assert env["NVIDIA_API_KEY"] == doctor.REDACTED and "HF_TOKEN" not in env and "SOME_OTHER_TOOL" not in env
    _, out = run(capsys, "doctor")
    assert "NCCL_DEBUG=INFO" in out and "nvapi-secret" not in out and "hf_secret" not in out


def test_env_defaults_say_whether_set_and_what_the_plugin_would_set(capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "gb300,h200")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    _, d = report(capsys)
    by = {e["name"]: e for e in d["env_defaults"]}
    arch = by["TORCH_CUDA_ARCH_LIST"]
    assert (arch["set"], arch["value"]) == (True, "9.0")
    assert [(x["device"], x["value"], x["plugin"]) for x in arch["defaults"]] == [(0, "10.3a", "sm100"), (1, "9.0a", "sm90")]
    assert arch["defaults"][0]["from"] == "hwprofile-sm100 0.1.0" and arch["defaults"][0]["reason"]
    assert (by["CUDA_MODULE_LOADING"]["set"], by["CUDA_MODULE_LOADING"]["value"]) == (False, None)
    assert "MYENGINE_FUSED_SHARED_EXPERTS" in by  # a downstream plugin's too
    _, out = run(capsys, "doctor")
    assert "set to '9.0', kept; plugin value 10.3a (device 0), 9.0a (device 1)  [from sm90, sm100]" in out
    assert "unset, would set LAZY" in out


def test_env_defaults_without_a_device_are_listed_per_installed_target(capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    no_device(monkeypatch)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    code, d = report(capsys)
    assert d["devices"] == [] and code == (1 if any(c["status"] == "FAIL" for c in d["checks"]) else 0)
    arch = {e["name"]: e for e in d["env_defaults"]}["TORCH_CUDA_ARCH_LIST"]
    got = {x["target"]: x["value"] for x in arch["defaults"]}
    assert got == {**got, "sm_90a": "9.0a", "sm_100a": "10.0a", "sm_103a": "10.3a", "sm_120a": "12.0a", "sm_121a": "12.1a"}
    assert all(x["device"] is None for x in arch["defaults"])
    _, out = run(capsys, "doctor")
    assert "env defaults (no device: per installed target" in out and "9.0a (sm_90a), 10.0a (sm_100a)" in out


def test_a_refused_device_name_is_a_fail_and_the_rest_is_still_reported(capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h300")
    code, d = report(capsys)
    (check,) = [c for c in d["checks"] if c["name"] == "devices"]
    assert code == 1 and check["status"] == "FAIL" and "h300" in check["detail"]
    assert check["fix"] == "unset HWPROFILE_DEVICE or set it to a name 'hwprofile devices' lists"
    assert d["versions"]["hwprofile"] == hwprofile.__version__ and d["env_defaults"]  # per target, as with no device


def test_a_profile_error_is_a_fail_that_says_what_to_do(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MAX_TOKENS", "abc")
    code, d = report(capsys)
    (check,) = [c for c in d["checks"] if c["name"] == "profile, device 0"]
    assert code == 1 and check["status"] == "FAIL" and "HWPROFILE_ROUTER_GEMM_MAX_TOKENS='abc'" in check["detail"]
    assert "unset the variable" in check["fix"] and check["fix"].endswith("hwprofile show --device 0")
    assert d["devices"][0]["error"] == check["detail"] and d["devices"][0]["fingerprint"] is None
    no_device(monkeypatch)
    code, d = report(capsys)
    failed = [c for c in d["checks"] if c["status"] == "FAIL" and c["name"].startswith("profile for ")]
    assert code == 1 and len(failed) == 1 and failed[0]["fix"].endswith("hwprofile show --simulate sm_90")  # once, not per target


def test_text_report_fits_one_screen(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("NVIDIA_REQUIRE_CUDA", "cuda>=12.8 " + "brand=tesla,driver>=470,driver<471 " * 20)  # as NGC images set it
    _, out = run(capsys, "doctor")
    lines = out.splitlines()
    sections = [ln for ln in lines if not ln.startswith(" ")]
    assert sections == ["versions:", "environment:", sections[2], "paths:", sections[4], "checks:"]
    assert sections[2].startswith("env defaults") and sections[4].startswith("devices")
    assert len(lines) <= 50, out
    (req,) = [ln for ln in lines if "NVIDIA_REQUIRE_CUDA" in ln]
    assert len(req) <= 110 and "--json has all" in req


def test_doctor_help_says_what_it_reports(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "doctor bug-report data: versions, environment, env defaults, paths, devices with plugin and fingerprint, checks" in out
