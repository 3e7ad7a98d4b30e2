"""tune() with a fake timer: re-measures only what is stale, writes a stamped file, resolves again; the host lock;
HWPROFILE_TUNE at the first profile(); the command."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest

import hwprofile
from hwprofile import retune, sweep, tuning
from hwprofile.cli import main
from hwprofile.optable import OPS, TABLE

from .helpers import FakeTimer, stale_tuned_file


def test_tune_re_measures_only_the_stale_op_and_the_profile_follows(caplog: pytest.LogCaptureFixture) -> None:
    stale = stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    before = hwprofile.profile(0)
    assert before["router_gemm.max_tokens"] == 16  # the stale file is ignored: the shipped value applies
    timer = FakeTimer(wins_to=10)
    with caplog.at_level(logging.INFO, logger="hwprofile"):
        result = hwprofile.tune(0, timer=timer)
    assert sorted(timer.calls) == sorted(("router_gemm", *g) for g in sweep.default_grid("router_gemm"))  # that op, its grid, once
    assert result.written == [stale] and result.measured == len(timer.calls)
    assert result.changes["router_gemm"]["router_gemm.max_tokens"] == (16, 10)
    assert set(result.changes["router_gemm"]) == {"router_gemm.max_tokens", "router_gemm.measured"}  # and its per-shape table
    after = hwprofile.profile(0)
    assert after is result.profile and after is not before
    assert after["router_gemm.max_tokens"] == 10 and after.explain("router_gemm.max_tokens").winner.source == f"tuned file {stale}"
    stamp, thresholds = tuning.read_tuned(stale)
    assert stamp.fallback["function"] == OPS["router_gemm"].fallback and stamp.plan  # stamped against what runs now
    assert thresholds["router_gemm.max_tokens"] == 10
    assert (stale.parent / tuning.SAMPLES_DIR / stale.name).exists()  # raw measurements beside it, as sweep writes them
    assert "router_gemm.max_tokens 16 -> 10" in caplog.text and "re-measured router_gemm" in caplog.text
    assert retune.plan(after).grids == {}  # nothing stale any more: a second tune measures nothing
    again = FakeTimer()
    assert hwprofile.tune(0, timer=again).changes == {} and again.calls == []


def test_tune_gives_the_decision_a_full_sweep_gives() -> None:
    """The same points through sweep.run: the same thresholds (tune adds no method of its own)."""
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    result = hwprofile.tune(0, timer=FakeTimer(wins_to=7))
    grid = sweep.default_grid("router_gemm")
    full = sweep.run(hwprofile.profile(0), "router_gemm", grid, FakeTimer(wins_to=7), box=sweep.box_grid("router_gemm"))
    _, thresholds = tuning.read_tuned(result.written[0])
    assert thresholds == full["thresholds"]


def test_a_simulated_device_needs_a_timer() -> None:
    with pytest.raises(retune.TuneError, match=r"simulated \(HWPROFILE_DEVICE\): there is no GPU to time"):
        hwprofile.tune(0, everything=True)


def test_a_failing_measurement_writes_nothing() -> None:
    stale = stale_tuned_file(hwprofile.profile(0))
    text = stale.read_text()
    hwprofile.reset()
    with pytest.raises(retune.TuneError, match="measuring failed: measuring on device 0 failed: RuntimeError: fake kernel failure"):
        hwprofile.tune(0, timer=FakeTimer(fail_at=("router_gemm", 3, 256, 7168)))
    assert stale.read_text() == text


def test_tune_refuses_inside_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retune, "capturing", lambda: True)
    with pytest.raises(retune.TuneError, match="while a CUDA graph is being captured"):
        hwprofile.tune(0, timer=FakeTimer())


def test_a_second_process_waits_for_the_first_and_then_finds_nothing_stale(monkeypatch: pytest.MonkeyPatch,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Two tuners of one tuned directory (threads here, as two processes would be): one measures, the other waits for it,
    reads the fresh table and measures nothing."""
    import filelock

    prof = hwprofile.profile(0)
    stale_tuned_file(prof)
    hwprofile.reset()
    directory = tuning.tuned_dir(prof.device, os.environ)
    held = filelock.FileLock(str(directory / f".tune-{socket.gethostname()}.lock"), thread_local=False)  # released by the thread
    held.acquire()
    first = FakeTimer()
    released = threading.Event()

    def other_process() -> None:
        time.sleep(0.5)
        doc = sweep.run(hwprofile.profile(0), "router_gemm", sweep.default_grid("router_gemm"), first)
        sweep.write(doc, directory / "router_gemm.toml")
        held.release()
        released.set()

    t = threading.Thread(target=other_process)
    t.start()
    second = FakeTimer()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        result = hwprofile.tune(0, timer=second, lock_timeout=20)
    t.join()
    assert released.is_set() and "another process on this host is tuning" in caplog.text
    assert second.calls == [] and not result.skipped and result.plan.grids == {}
    assert hwprofile.profile(0)["router_gemm.max_tokens"] == 10


def test_a_waiter_gives_up_after_the_bound_and_keeps_the_values(caplog: pytest.LogCaptureFixture) -> None:
    import filelock

    prof = hwprofile.profile(0)
    stale_tuned_file(prof)
    hwprofile.reset()
    directory = tuning.tuned_dir(prof.device, os.environ)
    held = filelock.FileLock(str(directory / f".tune-{socket.gethostname()}.lock"))
    with held:
        timer = FakeTimer()
        result = hwprofile.tune(0, timer=timer, lock_timeout=0.3)
    assert timer.calls == [] and "still tuning after 0.3 s" in result.skipped
    assert hwprofile.profile(0)["router_gemm.max_tokens"] == 16


# --- HWPROFILE_TUNE=stale at the first profile() ----------------------------------------------------------------


@pytest.fixture
def real_gpu(monkeypatch: pytest.MonkeyPatch) -> list[FakeTimer]:
    """The hook's view of a real GPU on this CPU machine: a device not simulated, a timer that measures."""
    from hwprofile import profiles

    made: list[FakeTimer] = []
    real_tune = retune.tune

    def tune(device: object = None, **kw: object) -> retune.TuneResult:
        made.append(FakeTimer())
        return real_tune(device, timer=made[-1], **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(retune, "tune", tune)
    monkeypatch.setattr(retune, "cannot_measure", lambda prof: "")
    real_first = profiles._hand_over

    def first(prof: hwprofile.Profile) -> hwprofile.Profile:  # the hook skips simulated devices: pose as a real one
        object.__setattr__(prof.device, "simulated", False)
        try:
            return real_first(prof)
        finally:
            object.__setattr__(prof.device, "simulated", True)

    monkeypatch.setattr(profiles, "_hand_over", first)
    return made


def test_hwprofile_tune_stale_tunes_at_the_first_profile(real_gpu: list[FakeTimer], monkeypatch: pytest.MonkeyPatch) -> None:
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    monkeypatch.setenv("HWPROFILE_TUNE", "stale")
    prof = hwprofile.profile(0)
    assert len(real_gpu) == 1 and real_gpu[0].calls  # measured once, no recursion through the profiles tuning resolves
    assert prof["router_gemm.max_tokens"] == 10 and hwprofile.profile(0) is prof


def test_hwprofile_tune_off_or_unset_never_tunes(real_gpu: list[FakeTimer], monkeypatch: pytest.MonkeyPatch) -> None:
    stale_tuned_file(hwprofile.profile(0))
    for value in (None, "off", "0"):
        if value is None:
            monkeypatch.delenv("HWPROFILE_TUNE", raising=False)
        else:
            monkeypatch.setenv("HWPROFILE_TUNE", value)
        hwprofile.reset()
        assert hwprofile.profile(0)["router_gemm.max_tokens"] == 16
    assert real_gpu == []


def test_the_hook_skips_capture_and_simulated_devices(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stale_tuned_file(hwprofile.profile(0))
    monkeypatch.setenv("HWPROFILE_TUNE", "stale")
    hwprofile.reset()
    calls: list[object] = []
    monkeypatch.setattr(retune, "tune", lambda *a, **k: calls.append(a))
    assert hwprofile.profile(0)["router_gemm.max_tokens"] == 16 and calls == []  # simulated: never
    prof = hwprofile.profile(0)
    object.__setattr__(prof.device, "simulated", False)
    try:
        monkeypatch.setattr(retune, "capturing", lambda: True)
        with caplog.at_level(logging.WARNING, logger="hwprofile"):
            assert retune.at_first_profile(prof) is prof
        assert "inside CUDA-graph capture" in caplog.text and calls == []
        monkeypatch.setattr(retune, "capturing", lambda: False)
        monkeypatch.setattr(retune, "cannot_measure", lambda p: "torch sees no GPU")
        assert retune.at_first_profile(prof) is prof and "cannot tune device 0 (torch sees no GPU)" in caplog.text
    finally:
        object.__setattr__(prof.device, "simulated", True)


def test_a_failing_tune_at_the_first_profile_warns_and_keeps_the_values(real_gpu: list[FakeTimer], monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    stale_tuned_file(hwprofile.profile(0))
    monkeypatch.setenv("HWPROFILE_TUNE", "stale")
    monkeypatch.setattr(retune, "tune", lambda *a, **k: (_ for _ in ()).throw(retune.TuneError("no luck")))
    hwprofile.reset()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        prof = hwprofile.profile(0)
    assert prof["router_gemm.max_tokens"] == 16 and "tuning device 0 failed (no luck)" in caplog.text


def test_importing_hwprofile_does_not_import_the_tuner() -> None:
    import subprocess
    import sys

    code = "import hwprofile, sys; hwprofile.profile(0); print('hwprofile.retune' in sys.modules)"
    env = {**os.environ, "HWPROFILE_DEVICE": "h200"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert out == "False"
    assert hwprofile.tune is retune.tune


# --- the command ------------------------------------------------------------------------------------------------


def test_dry_run_lists_what_would_be_measured(capsys: pytest.CaptureFixture[str]) -> None:
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    assert main(["tune", "--dry-run"]) == 0
    out = capsys.readouterr().out
    n = len(sweep.default_grid("router_gemm"))  # the catalog's routers and the box edges
    assert f"router_gemm       changed  {n}" in out and "fallback function changed" in out
    assert "gemv              fresh    0" in out
    assert f"would measure {n} point(s), about" in out and "s of GPU time" in out


def test_dry_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["tune", "--dry-run", "--all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["devices"][0]["points"] == sum(len(sweep.default_grid(op)) for op in TABLE) and doc["devices"][0]["estimate_s"] > 0


def test_tune_on_a_simulated_device_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--all"]) == 2
    err = capsys.readouterr().err
    assert "tune measures real kernels: device 0 (NVIDIA H200) is simulated" in err and "--dry-run" in err
    assert main(["tune"]) == 0 and "device 0: nothing stale" in capsys.readouterr().out


def test_the_command_prints_a_line_per_op_off_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    stale_tuned_file(hwprofile.profile(0))
    hwprofile.reset()
    real_tune = retune.tune
    monkeypatch.setattr(retune, "cannot_measure", lambda prof: "")
    monkeypatch.setattr(retune, "tune", lambda device=None, **kw: real_tune(device, timer=FakeTimer(), **kw))
    assert main(["tune"]) == 0
    captured = capsys.readouterr()
    assert f"measured router_gemm ({len(sweep.default_grid('router_gemm'))} points on this rank)" in captured.err
    assert "re-measured router_gemm (router_gemm.max_tokens 16 -> 10, router_gemm.measured 0 measured shapes -> " in captured.out
    assert "wrote " in captured.out


_DEADLOCK = """
import os, sys, threading
import hwprofile
from hwprofile import profiles, retune
from hwprofile.ops import _dispatch

first = profiles._hand_over

def pose_real(prof):  # the hook skips simulated devices: pose as a real one
    object.__setattr__(prof.device, "simulated", False)
    try:
        return first(prof)
    finally:
        object.__setattr__(prof.device, "simulated", True)

profiles._hand_over = pose_real
in_hook, other_has_lock = threading.Event(), threading.Event()

def tune(device=None, **kw):
    in_hook.set()
    other_has_lock.wait(5)
    _dispatch.table(0)  # what measuring does (ops.run_kernel)
    prof = hwprofile.profile(0)
    return retune.TuneResult(0, retune.plan(prof), profile=prof)

retune.tune = tune
retune.cannot_measure = lambda prof: ""  # no GPU here: measuring is faked above

def other():
    in_hook.wait(5)
    with _dispatch._tables_lock:  # an op's first call on device 0, building its table
        other_has_lock.set()
        hwprofile.profile(0)

threads = [threading.Thread(target=hwprofile.profile, args=(0,), daemon=True), threading.Thread(target=other, daemon=True)]
for t in threads:
    t.start()
for t in threads:
    t.join(10)
print("deadlock" if any(t.is_alive() for t in threads) else "ok")
sys.stdout.flush()
os._exit(0)
"""


def test_an_op_in_another_thread_during_start_up_tuning_cannot_deadlock() -> None:
    """Measuring builds device 0's dispatch table (ops.run_kernel), whose lock another thread may hold while it asks
    profile() for the device: tuning at the first profile() must not hold profile()'s lock meanwhile (a process of
    its own: a deadlock would leave locks that no later test could take)."""
    import subprocess
    import sys

    env = {**os.environ, "HWPROFILE_TUNE": "stale"}
    out = subprocess.run([sys.executable, "-c", _DEADLOCK], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr
