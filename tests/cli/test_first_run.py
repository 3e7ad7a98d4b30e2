"""The CLI as a new user meets it: --version, devices, explain --list, flags only where they work,
progress only on a terminal, compile without NVRTC in one line, a collect-env style doctor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hwprofile import _cli_common
from hwprofile.cli import main
from hwprofile.errors import ToolchainError
from hwprofile.kernels import _pipeline as jit
from hwprofile.kernels import toolchain


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version_lists_core_and_plugins(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert out.startswith("hwprofile 0.1.0 (Python ")
    assert "plugin sm90: hwprofile-sm90 0.1.0" in out and "plugin myengine: myengine-hwprofile 0.3.0" in out


def test_version_imports_no_plugin() -> None:
    code = (
        "import sys; from hwprofile.cli import version_text; version_text(); print([m for m in sys.modules if m.startswith('hwprofile_')])"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["plugins", "--device", "0"], "--device"),
        (["devices", "--device", "0"], "--device"),
        (["doctor", "--simulate", "h200"], "--simulate"),
        (["doctor", "--device", "1"], "--device"),
        (["compile", "--simulate", "h200"], "--simulate"),
        (["compile", "--device", "0"], "--device"),
        (["sweep", "gemv", "--simulate", "h200"], "--simulate"),
        (["sweep", "gemv", "--json"], "--json"),
        (["cache", "--json"], "--json"),
        (["show", "--stats"], "--stats"),
    ],
)
def test_flags_only_where_they_work(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["show", "--json"], ["explain", "deterministic", "--json"], ["env", "--json"], ["plugins", "--json"], ["devices", "--json"]]
)
def test_json_is_json_where_accepted(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run(capsys, *argv, "--simulate", "h200")
    assert code == 0 and isinstance(json.loads(out), (dict, list))


@pytest.mark.hwprofile_per_device  # lists the session's visible devices
def test_devices_lists_simulatable_and_visible(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "devices", "--simulate", "gb300,sm_110")
    assert code == 0
    assert "device 0: NVIDIA GB300 (sm_103, simulated)" in out and "device 1: Simulated sm_110 (sm_110, simulated)" in out
    assert "rtx-pro-6000" in out and "dgx-spark" in out and "sm_XY or X.Y" in out
    code, out, _ = run(capsys, "devices", "--json")
    d = json.loads(out)
    names = {e["name"]: e for e in d["simulatable"]}
    assert names["h200"]["compute_capability"] == [9, 0] and names["h200"]["from"] == "hwprofile"


def test_explain_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--list", "--simulate", "h200")
    assert code == 0 and "router_gemm.max_tokens" in out and "HWPROFILE_ROUTER_GEMM_MAX_TOKENS" in out
    code, out, _ = run(capsys, "explain", "--simulate", "h200", "--json")
    keys = json.loads(out)
    assert keys["router_gemm.max_tokens"]["env_var"] == "HWPROFILE_ROUTER_GEMM_MAX_TOKENS"


def test_simulated_devices_reported_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "show", "--simulate", "h200")
    assert "sm_90, simulated" in out
    _, out, _ = run(capsys, "plugins", "--simulate", "h200")
    assert "(sm_90, simulated)" in out


def test_show_on_stale_free_h200_prints_no_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first command on sm90: no wall of staleness text before the table."""
    p = subprocess.run([sys.executable, "-m", "hwprofile.cli", "show", "--simulate", "h200"], capture_output=True, text=True)
    assert p.returncode == 0 and "stale" not in p.stderr.lower() and "STALE" not in p.stdout
    widest = max(len(ln) for ln in p.stdout.splitlines())
    assert widest <= 200, widest


class _NotTty:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = _NotTty()
    monkeypatch.setattr(sys, "stderr", pipe)
    assert _cli_common._progress(True, 60) is None

    class Tty(_NotTty):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    progress = _cli_common._progress(True, 60)
    assert progress is not None
    progress(1, 2, "x")
    assert "\r[" in tty.text
    assert _cli_common._progress(False, 60) is None


def test_compile_without_nvrtc_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def no_nvrtc() -> tuple[int, int]:
        calls.append(1)
        raise ToolchainError(
            "cuda-python's NVRTC bindings are not importable (No module named 'cuda'); install them with pip install './core[cu13]'"
        )

    monkeypatch.setattr(toolchain, "nvrtc_version", no_nvrtc)  # jit.check_toolchain is toolchain's
    monkeypatch.setattr(jit, "compile_all", lambda *a, **k: pytest.fail("compile_all must not run without a toolchain"))
    code, out, err = run(capsys, "compile", "--arch", "all")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwprofile: error: cannot compile: ") and "[cu13]" in lines[0]
    assert len(calls) == 1


def test_compile_with_mismatched_headers_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "nvrtc_version", lambda: (12, 9))
    problem = "NVRTC is CUDA 12 but the CUDA headers found are not: /x/cu13/include (CUDA 13)"
    monkeypatch.setattr(toolchain, "cuda_headers", lambda: ("/x/cu13/include", problem))
    monkeypatch.setattr(jit, "compile_all", lambda *a, **k: pytest.fail("compile_all must not run"))
    code, _, err = run(capsys, "compile")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "NVRTC is CUDA 12" in err


def test_doctor_json_is_a_collect_env_report(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "gb300")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    code, out, _ = run(capsys, "doctor", "--json")
    d = json.loads(out)
    v = d["versions"]
    assert v["hwprofile"] == "0.1.0" and v["python"] == sys.version.split()[0] and v["os"]
    assert v["plugin sm90"] == "hwprofile-sm90 0.1.0" and "torch" in v and "torch CUDA" in v and "nvrtc" in v
    assert d["environment"]["HWPROFILE_DEVICE"] == "gb300" and d["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert d["paths"]["kernel cache"] and d["paths"]["config"] and "tuned files, device 0" in d["paths"]
    assert d["devices"][0]["simulated"] is True
    checks = {c["name"]: c for c in d["checks"]}
    assert "simulated" in checks["devices"]["detail"] and checks["devices"]["status"] == "INFO"
    assert code == (1 if any(c["status"] == "FAIL" for c in d["checks"]) else 0)


@pytest.mark.hwprofile_per_device  # doctor reports the session's devices
def test_doctor_text_sections(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doctor")
    for section in ("versions:", "environment:", "paths:", "checks:"):
        assert section in out
    assert code in (0, 1)


@pytest.mark.hwprofile_per_device  # doctor reports the session's devices
def test_doctor_fails_on_header_mismatch_and_warns_on_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.bindings")
    from hwprofile import device, doctor

    monkeypatch.setattr(jit, "nvrtc_version", lambda: (12, 9))
    monkeypatch.setattr(jit, "nvrtc_archs", lambda: (90, 100))
    monkeypatch.setattr(jit, "cuda_headers", lambda: ("/x", "NVRTC is CUDA 12 but the CUDA headers found are not: /x (CUDA 13)"))
    checks = {c.name: c for c in doctor._checks(device.detect(), (12, 9), "13.0")}
    assert checks["headers"].status == "FAIL" and "cu12" in checks["headers"].fix
    fix = checks["torch vs nvrtc"].fix
    assert checks["torch vs nvrtc"].status == "WARN" and "[cu13]" in fix
    assert not re.search(r"pip install 'hwprofile\[[\w,]+\]'", fix)  # never by bare name: a path or a git reference


def test_new_plugin_hint_runs_as_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "new-plugin", "sm110", "--capability", "11.0")
    assert code == 0
    hint = out.strip().splitlines()[-1]
    assert hint == "next: pip install ./hwprofile-sm110 && python -m pytest ./hwprofile-sm110/tests && hwprofile compile --arch sm_110"
    code, out, _ = run(capsys, "new-plugin", "sm87x", "--capability", "8.7", "--dir", str(tmp_path / "abs"))
    assert f"pip install {tmp_path / 'abs'} " in out


def test_unknown_simulated_device_mentions_generic_names(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", "--simulate", "h300")
    assert code == 2 and "sm_XY or X.Y" in err and "hwprofile devices" in err


def test_version_flag_in_a_subprocess() -> None:
    p = subprocess.run([sys.executable, "-m", "hwprofile.cli", "--version"], capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 0 and p.stdout.startswith("hwprofile ")
