"""CLI flags that were accepted and then ignored or misreported, and advice that the next command refused."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hwprofile import _cli_sweep, cli
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

    monkeypatch.setattr(_cli_sweep, "_profile", no_gpu)
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
    from hwprofile.kernels import _pipeline as jit

    def stop() -> None:
        raise SystemExit(0)

    monkeypatch.setattr(jit, "check_toolchain", stop)  # the environment check runs first; stop before compiling
    with pytest.raises(SystemExit):
        cli.main(["compile", "--arch", "sm_90a"])
    assert "did you mean HWPROFILE_ROUTER_GEMM_MAX_TOKENS?" in caplog.text


@pytest.mark.hwprofile_per_device  # doctor reports the session's devices
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


# --- an engine calling hwprofile in its own process: nothing of the process may change -----------


def _child(code: str, env: dict[str, str] | None = None) -> str:
    import os
    import subprocess
    import sys
    import textwrap

    e = {k: v for k, v in os.environ.items() if k != "HWPROFILE_DEVICE"}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env={**e, **(env or {})})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def test_simulate_holds_for_one_in_process_call_only(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`main([..., "--simulate", X])` used to leave HWPROFILE_DEVICE=X in the caller's environment (and its subprocesses')."""
    import os

    import hwprofile

    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    assert cli.main(["show", "--simulate", "gb300"]) == 0 and "GB300" in capsys.readouterr().out
    assert "HWPROFILE_DEVICE" not in os.environ
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    assert cli.main(["show", "--simulate", "gb300"]) == 0
    assert os.environ["HWPROFILE_DEVICE"] == "h200" and hwprofile.profile().device.name == "NVIDIA H200"


def test_a_closed_stdout_is_silenced_only_by_the_program() -> None:
    """In-process, a broken pipe returns 0 and leaves the caller's fd 1 and fd table alone; the program
    points its own stdout at /dev/null (so its final flush cannot fail) and leaks no descriptor."""
    out = _child(
        """
        import io, os, sys
        from hwprofile.cli import main
        r, w = os.pipe(); os.close(r)
        saved = os.dup(1); os.dup2(w, 1); os.close(w)
        fds = sorted(os.listdir("/proc/self/fd")); ino = os.fstat(1).st_ino
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        code = main(["show", "--simulate", "h200"])
        same = (os.fstat(1).st_ino == ino, sorted(os.listdir("/proc/self/fd")) == fds)
        code2 = main(["show", "--simulate", "h200"], program=True)
        devnull = os.path.realpath(f"/proc/self/fd/1") == os.devnull
        leak = sorted(os.listdir("/proc/self/fd")) != fds
        os.dup2(saved, 1)
        sys.stdout = sys.__stdout__
        print(code, *same, code2, devnull, leak)
        """,
        {"HWPROFILE_DEVICE": ""},
    )
    assert out.split() == ["0", "True", "True", "0", "True", "False"]


def test_an_in_process_pytest_run_gives_hwprofile_device_back(tmp_path: Path) -> None:
    """The pytest plugin's --hwprofile-device must not outlive the run (pytest.main, pytester in-process)."""
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    out = _child(
        f"""
        import os, pytest, hwprofile
        before = os.environ.get("HWPROFILE_DEVICE")
        rc = pytest.main(["-q", "-p", "no:cacheprovider", "--hwprofile-device=h200", {str(tmp_path / "test_x.py")!r}])
        print(int(rc), before, os.environ.get("HWPROFILE_DEVICE"))
        """
    )
    assert out.splitlines()[-1].split() == ["0", "None", "None"]


def test_sweep_plot_leaves_the_callers_matplotlib_alone(tmp_path: Path) -> None:
    """plot() used matplotlib.use("Agg") and pyplot: it switched a notebook's backend and kept every figure open."""
    pytest.importorskip("matplotlib")
    out = _child(
        f"""
        import matplotlib
        matplotlib.use("pdf")
        import matplotlib.pyplot as plt
        from hwprofile import sweep
        ms = [{{"m": m, "n": 256, "k": 7168, "kernel_us": 3.0, "fallback_us": 7.0}} for m in (1, 2, 4)]
        doc = {{"stamp": {{"op": "router_gemm", "device": "NVIDIA H200", "fallback": {{"function": "torch.mm", "torch": "2.11"}}}},
               "measurements": ms, "thresholds": {{"router_gemm.max_tokens": 4}}}}
        for i in range(3):
            sweep.plot(doc, __import__("pathlib").Path({str(tmp_path)!r}) / f"p{{i}}.png")
        print(matplotlib.get_backend(), len(plt.get_fignums()))
        """
    )
    assert out.split() == ["pdf", "0"]
    assert (tmp_path / "p2.png").stat().st_size > 1000


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["show", "--help"]])
def test_argparse_output_into_a_closed_pipe_exits_quietly(argv: list[str]) -> None:
    """`hwprofile --version | head -1`: argparse prints and exits itself, its text still in stdout's
    buffer; the program must flush it and end with status 0, not the interpreter's "Exception
    ignored ... BrokenPipeError" and 120. stdout is buffered here, as it is for a pipe."""
    import os

    out = _child(
        f"""
        import io, os, sys
        from hwprofile.cli import console
        r, w = os.pipe(); os.close(r); os.dup2(w, 1); os.close(w)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))  # buffered, like a pipe
        sys.argv = ["hwprofile", *{argv!r}]
        console()
        """,
        {"PYTHONUNBUFFERED": ""} if "PYTHONUNBUFFERED" in os.environ else None,
    )
    assert out == ""


def test_in_process_main_keeps_the_callers_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine calling main() must get its KeyboardInterrupt back; only the program turns it into status 130."""

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_show", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["show"])
    assert cli.main(["show"], program=True) == 130
