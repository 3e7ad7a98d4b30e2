"""The CLI: show / plugins / explain / env / doctor / cache, JSON output, one-line user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hwprofile import costmodel
from hwprofile.cli import main
from hwprofile.device import simulated_detection
from hwprofile.plugin import profile_for


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "--simulate", "gb300", "--json")
    d = json.loads(out)
    assert code == 0
    assert d["device"]["name"] == "NVIDIA GB300" and d["device"]["compute_capability"] == [10, 3] and d["device"]["simulated"] is True
    assert d["plugin"] == {**d["plugin"], "name": "sm100", "distribution": "hwprofile-sm100", "nvrtc_arch": "sm_103a"}
    assert d["settings"]["router_gemm.max_tokens"]["source"].startswith("myengine-hwprofile")


def test_show_text_lists_settings_with_source(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "--simulate", "l40s")
    assert code == 0 and "plugin: none" in out and "no installed architecture plugin serves sm_89" in out
    assert "router_gemm.max_tokens" in out


def test_show_second_device_of_mixed_host(capsys: pytest.CaptureFixture[str]) -> None:
    _code, out, _ = run(capsys, "show", "--simulate", "gb300,rtx-pro-6000", "--device", "1", "--json")
    assert json.loads(out)["plugin"]["name"] == "sm120"


def test_explain_shows_chain(capsys: pytest.CaptureFixture[str]) -> None:
    """A key every layer kind sets: the core's limit, sm100's (the kernel's M limit of an unmeasured SKU), myengine's."""
    code, out, _ = run(capsys, "explain", "router_gemm.max_tokens", "--simulate", "b200")
    assert code == 0
    assert "hwprofile core" in out and "hwprofile-sm100" in out and "myengine-hwprofile" in out and "->" in out
    code, out, _ = run(capsys, "explain", "router_gemm.max_tokens", "--simulate", "b200", "--json")
    d = json.loads(out)
    assert [c["kind"] for c in d["chain"]] == ["core", "arch", "downstream"]


def test_show_summarises_a_cost_model_and_explain_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    """A model is hundreds of characters: show says whether it was fitted, explain gives it in words and in full."""
    code, out, _ = run(capsys, "show", "--simulate", "h200")
    h200 = profile_for(simulated_detection("h200").devices[0])
    fitted = costmodel.parse("gemv", h200["gemv.model"], where="t").samples
    assert code == 0 and fitted > 1 and f"<cost model fitted on {fitted} samples>" in out
    assert "<cost model: a default, not fitted>" in out  # fp8_gemv on sm90: the bandwidth rule (hwprofile_sm90.predicted())
    code, out, _ = run(capsys, "explain", "gemv.model", "--simulate", "h200")
    assert code == 0 and "cost model: kernel " in out and f"fitted on {fitted} samples" in out and f"samples={fitted}" in out


def test_env_export_skips_user_set(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("MYENGINE_FUSED_SHARED_EXPERTS", raising=False)
    _code, out, _ = run(capsys, "env", "--export", "--simulate", "rtx-pro-6000")
    assert "export TORCH_CUDA_ARCH_LIST=12.0a" in out and "export MYENGINE_FUSED_SHARED_EXPERTS=1" in out
    assert "CUDA_MODULE_LOADING" not in out


def test_bad_env_value_is_one_line_no_traceback() -> None:
    env = {**os.environ, "HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "abc", "HWPROFILE_DEVICE": "h200"}
    p = subprocess.run([sys.executable, "-m", "hwprofile.cli", "show"], env=env, capture_output=True, text=True)
    assert p.returncode == 2
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("hwprofile: error:")]
    assert len(errors) == 1 and "HWPROFILE_ROUTER_GEMM_MAX_TOKENS='abc'" in errors[0] and "Traceback" not in p.stderr


def test_unknown_simulated_device_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", "--simulate", "h300")
    assert code == 2 and "known devices" in err


def test_unknown_setting(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "explain", "nope", "--simulate", "h200")
    assert code == 2 and "unknown setting 'nope'" in err


def test_plugins_lists_all(capsys: pytest.CaptureFixture[str]) -> None:
    _code, out, _ = run(capsys, "plugins", "--simulate", "gb300,rtx-pro-6000", "--json")
    d = json.loads(out)
    by = {p["name"]: p for p in d["plugins"]}
    assert set(by) >= {"sm90", "sm100", "sm120", "myengine"}
    assert by["sm100"]["selected_for_devices"] == [0] and by["sm120"]["selected_for_devices"] == [1]
    assert by["sm120"]["targets"] == {"12.0": "sm_120a", "12.1": "sm_121a"}


@pytest.mark.hwprofile_per_device  # doctor reports the session's devices
def test_doctor_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doctor")
    assert "nvrtc" in out and code in (0, 1)


def test_cache_info(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "cache", "info")
    assert code == 0 and "entries:" in out


def test_compile_unknown_arch(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "compile", "--arch", "sm_75")
    assert code == 2 and "no installed plugin targets sm_75" in err


def test_cache_clear_removes_entries(capsys: pytest.CaptureFixture[str], tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.kernels import cache as kcache

    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    key = "a" * 64
    (d / f"{key}.cubin").write_bytes(kcache.MAGIC + b"x")
    (d / f"{key}.cubin.lock").write_bytes(b"")
    mine = [d / "a.cubin", d / "a.cubin.lock", d / "build.tmp", d / "x.owner"]  # the user's own files: never ours
    for f in mine:
        f.write_bytes(b"user data")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(d))
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and "removed 1 entries" in out and sorted(d.iterdir()) == sorted(mine)
    assert "left alone: 4 files hwprofile did not write" in out


def test_env_json_and_plain(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    code, out, _ = run(capsys, "env", "--simulate", "gb300", "--json")
    d = json.loads(out)
    assert code == 0 and d["TORCH_CUDA_ARCH_LIST"]["value"] == "10.3a" and "CUDA_MODULE_LOADING" not in d
    code, out, _ = run(capsys, "env", "--simulate", "gb300")
    assert code == 0 and "TORCH_CUDA_ARCH_LIST=10.3a" in out and "already set by you, left alone: CUDA_MODULE_LOADING" in out


def test_plugins_text(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    code, out, _ = run(capsys, "plugins", "--simulate", "dgx-spark")
    assert code == 0 and "sm120" in out and "(12, 1)->sm_121a" not in out and "12.1->sm_121a" in out
    assert "disabled by HWPROFILE_DISABLE_PLUGINS: myengine" in out and "device 0 NVIDIA GB10 (sm_121, simulated): sm120 claims" in out
