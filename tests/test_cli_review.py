"""CLI flags that were accepted and then ignored or misreported, and advice that the next command refused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hwprofile import cli
from hwprofile.errors import DeviceError


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["0", "-3", "two"])
def test_compile_jobs_must_be_a_positive_integer(capsys: pytest.CaptureFixture[str], jobs: str) -> None:
    assert "--jobs: expected a positive integer" in _usage_error(capsys, "compile", "--jobs", jobs)


def test_env_json_and_export_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    assert "not allowed with argument" in _usage_error(capsys, "env", "--json", "--export")


@pytest.mark.parametrize("cmd", ["show", "explain", "env", "plugins", "devices"])
def test_empty_simulate_name_is_refused(capsys: pytest.CaptureFixture[str], cmd: str) -> None:
    assert "--simulate: expected a device name" in _usage_error(capsys, cmd, "--simulate", " ")


def test_explain_refuses_a_key_together_with_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "--simulate", "h200", "--list", "nosuch"]) == 2
    assert "explain takes a KEY or --list, not both" in capsys.readouterr().err


def test_sweep_without_a_gpu_does_not_suggest_simulation(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def no_gpu(args: argparse.Namespace) -> None:
        raise DeviceError("no NVIDIA GPU: NVML could not start. Simulate one with HWPROFILE_DEVICE=<name>, e.g. h200.")

    monkeypatch.setattr(cli, "_profile", no_gpu)
    assert cli.main(["sweep", "router_gemm"]) == 2
    err = capsys.readouterr().err
    assert "needs a real NVIDIA GPU" in err and "Simulate" not in err and "HWPROFILE_DEVICE" not in err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HWPROFILE_CACHE": "disabled"}, "HWPROFILE_CACHE='disabled' is not valid"),
        ({"HWPROFILE_STRICT": "maybe"}, "HWPROFILE_STRICT='maybe' is not valid"),
    ],
)
def test_compile_checks_control_values_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str], message: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["compile", "--arch", "sm_90a"]) == 2
    err = capsys.readouterr().err
    assert err.count(message) == 1 and "FAILED" not in err


def test_compile_warns_about_a_misspelt_setting(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from hwprofile import settings

    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MAX_TOKEN", "4")
    monkeypatch.setattr(settings, "_warned_vars", set())
    monkeypatch.setenv("HWPROFILE_CACHE", "off")  # nothing to write; the check comes before any compile
    from hwprofile import jit

    def stop() -> None:
        raise SystemExit(0)

    monkeypatch.setattr(jit, "check_toolchain", stop)  # the environment check runs first; stop before compiling
    with pytest.raises(SystemExit):
        cli.main(["compile", "--arch", "sm_90a"])
    assert "did you mean HWPROFILE_ROUTER_GEMM_MAX_TOKENS?" in caplog.text


def test_doctor_fails_on_a_kernel_cache_directory_the_cache_refuses(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """A shared cache directory makes every kernel load fail: doctor says so as a FAIL (exit 1), naming the fix."""
    from hwprofile.cli import main

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(shared))
    assert main(["doctor", "--json"]) == 1
    (check,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "kernel cache"]
    assert check["status"] == "FAIL" and str(shared) in check["detail"] and "chmod 700" in check["detail"]
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(tmp_path / "not-yet"))
    main(["doctor", "--json"])
    (check,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "kernel cache"]
    assert check["status"] == "OK" and "created on the first compile" in check["detail"]
    monkeypatch.setenv("HWPROFILE_CACHE", "off")
    main(["doctor", "--json"])
    (check,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "kernel cache"]
    assert check["status"] == "INFO"
