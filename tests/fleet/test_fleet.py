"""The fleet store (HWPROFILE_REMOTE) against a real Redis server (conftest): hosts are separate processes with their own
cache and config directories; a store value is trusted no more than a file; a store that is down costs one bounded wait."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import _env, _remote, tuned_layers, tuning
from hwprofile._redact import redact
from hwprofile.errors import CacheError, SettingError
from hwprofile.kernels import _pipeline, toolchain
from hwprofile.kernels import cache as kcache
from hwprofile.kernels.spec import KernelSpec, Launch
from tests.serving.toy_kernels import EXPR, toy_package

from .conftest import Server, free_port

WORKER = Path(__file__).with_name("worker.py")


def private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def host_env(tmp: Path, name: str, url: str, **extra: str) -> dict[str, str]:
    """The environment of one "host": its own kernel cache and config directory, the shared store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_env.PREFIX)}
    env.update({
        _env.REMOTE.name: url, _env.CACHE_DIR.name: str(private(tmp / name / "cache")),
        _env.CONFIG_DIR.name: str(private(tmp / name / "config")), _env.DISABLE_PLUGINS.name: "myengine",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
    })
    env.update(extra)
    return env


def output(p: subprocess.CompletedProcess[str] | Any) -> dict[str, Any]:
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


# --- the URL ---------------------------------------------------------------------------------------------------


def test_the_url_forms_and_the_password_never_shown() -> None:
    for ok in ("redis://cache:6379", "redis://:secret@cache:6379/2", "rediss://user:secret@cache:6380/0?ssl_cert_reqs=required"):
        assert _env.REMOTE.parse(ok) == ok
    assert redact("rediss://user:secret@cache:6380/0") == "rediss://user:***@cache:6380/0"
    assert redact("redis://:secret@cache") == "redis://:***@cache" and redact("redis://cache:1/0") == "redis://cache:1/0"
    with pytest.raises(SettingError) as e:
        _env.REMOTE.parse("http://:secret@cache:6379")
    assert "secret" not in str(e.value) and str(e.value).startswith(f"{_env.REMOTE.name}='http://:***@cache:6379' is not valid")


@pytest.mark.parametrize("bad", ["cache:6379", "redis://", "redis://cache:99999", "redis://cache/zero"])
def test_a_bad_url_is_an_error_naming_the_variable(bad: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(_env.REMOTE.name, bad)
    monkeypatch.setenv(_env.DEVICE.name, "h200")
    with pytest.raises(SettingError, match=f"^{_env.REMOTE.name}=.* is not valid: .*[eE]xpected redis://"):
        hwprofile.profile(0)
    spec = KernelSpec("toy", "toy_layer_kernels", "k.cu", (EXPR,), lambda **kw: None, plugin="toy", distribution_version="toy 1.0")
    monkeypatch.setattr(toolchain, "nvrtc_compile", lambda *a, **k: pytest.fail("compiled although the URL is refused"))
    monkeypatch.setenv(_env.CACHE_DIR.name, str(private(tmp_path / "cache")))
    monkeypatch.syspath_prepend(str(toy_package(tmp_path / "p")[0]))
    with pytest.raises(CacheError, match=_env.REMOTE.name):  # a KernelError: ops fall back with one warning
        _pipeline.compile_spec(spec, "sm_90a")


# --- cubins: two hosts, one compiles -------------------------------------------------------------------------------


def test_two_hosts_one_compiles_and_publishes_the_other_hits(store: Server, tmp_path: Path) -> None:
    """Real NVRTC in the first process; the second, another cache directory, runs no NVRTC at all."""
    pytest.importorskip("cuda.bindings.nvrtc")
    site, inc = toy_package(tmp_path / "prefix")
    runs = []
    for name in ("a", "b"):
        forbid = {_env.NO_COMPILE.name: "1"} if name == "b" else {}  # b: a compile would be an error, not a count
        p = subprocess.run([sys.executable, str(WORKER), "compile", str(site), str(inc)], capture_output=True, text=True,
                           env=host_env(tmp_path, name, store.url, **forbid), timeout=300)
        runs.append(output(p))
    a, b = runs
    assert a["pipeline"]["compiles"] == 1 and a["remote"]["cubin"] == {"hits": 0, "misses": 1, "rejected": 0, "publishes": 1}
    assert b["pipeline"]["compiles"] == 0 and b["remote"]["cubin"] == {"hits": 1, "misses": 0, "rejected": 0, "publishes": 0}
    assert b["key"] == a["key"] and b["cubin"] == a["cubin"] and b["layer"] == f"{store.url} (remote)"
    assert b["pipeline"]["hits"] == {f"{store.url} (remote)": 1}
    assert store.client.exists(_remote.cubin_key(a["key"]))
    assert (tmp_path / "b" / "cache" / kcache.entry_name(a["key"])).is_file()  # the local layer first, next time


def test_cold_hosts_compile_each_kernel_once(store: Server, tmp_path: Path) -> None:
    """Six processes, each a host with an empty cache, need one kernel at the same moment: NVRTC runs once in the
    fleet (the compile lock in the store); the others wait for the published cubin and read it."""
    pytest.importorskip("cuda.bindings.nvrtc")
    site, inc = toy_package(tmp_path / "prefix")
    start = str(time.time() + 8)  # after every interpreter has started and imported
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), "compile", str(site), str(inc)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=host_env(tmp_path, f"h{i}", store.url, FLEET_START_AT=start))
        for i in range(6)
    ]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        outs.append(output(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)))
    assert sorted(o["pipeline"]["compiles"] for o in outs) == [0] * 5 + [1], outs
    assert len({o["key"] for o in outs}) == 1 and len({o["cubin"] for o in outs}) == 1
    assert sum(o["remote"]["cubin"]["publishes"] for o in outs) == 1
    assert sum(o["remote"]["cubin"]["hits"] for o in outs) == 5 and all(o["remote"]["errors"] == 0 for o in outs)
    assert not store.client.keys(f"{_remote.NAMESPACE}:lock:compile:*")  # released


def test_a_killed_compile_holder_costs_one_lock_lifetime(store: Server, tmp_path: Path) -> None:
    """The host compiling a kernel is killed inside NVRTC: its lock expires, and a waiting host compiles and publishes."""
    pytest.importorskip("cuda.bindings.nvrtc")
    site, inc = toy_package(tmp_path / "prefix")
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, str(WORKER), "compile-hold", str(site), str(inc)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=host_env(tmp_path, "holder", store.url, FLEET_LOCK_TTL="2", FLEET_READY=str(ready)))
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
            time.sleep(0.05)
        assert store.client.keys(f"{_remote.NAMESPACE}:lock:compile:*")  # the holder holds the kernel's compile lock
        waiter = subprocess.Popen([sys.executable, str(WORKER), "compile", str(site), str(inc)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=host_env(tmp_path, "waiter", store.url))
        time.sleep(4)  # the waiter waits for the live holder (which renews its 2 s lock) ...
        assert waiter.poll() is None, waiter.communicate()
        holder.send_signal(signal.SIGKILL)  # ... until the holder dies
        stdout, stderr = waiter.communicate(timeout=300)
    finally:
        holder.kill()
        holder.communicate()
    out = output(subprocess.CompletedProcess(waiter.args, waiter.returncode, stdout, stderr))
    assert out["pipeline"]["compiles"] == 1 and out["remote"]["cubin"]["publishes"] == 1, (out, stderr)
    assert 4 < out["seconds"] < 4 + 2 + 15, out  # the wait, then at most one lock lifetime (2 s) and the compile


# --- tuned tables: one tuner per SKU -------------------------------------------------------------------------------


def test_eight_cold_hosts_tune_once(store: Server, tmp_path: Path) -> None:
    """Eight processes, each a host with no tuned file, start tuning at the same moment: one measures, seven read its table."""
    start = str(time.time() + 8)  # after every interpreter has started and imported
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), "tune"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=host_env(tmp_path, f"h{i}", store.url, HWPROFILE_DEVICE="gb300", FLEET_START_AT=start))
        for i in range(8)
    ]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        outs.append(output(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)))
    measured = sorted(o["measured"] for o in outs)
    grid = len(__import__("hwprofile.sweep", fromlist=["default_grid"]).default_grid("router_gemm"))
    assert measured == [0] * 7 + [grid], outs  # the grid once, in the whole fleet
    assert all(not o["skipped"] for o in outs)
    keys = [k.decode() for k in store.client.keys(f"{_remote.NAMESPACE}:tuned:*")]
    assert len(keys) == 1 and keys[0].endswith(":sm100:router_gemm"), keys
    key = keys[0]
    readers = [o for o in outs if o["measured"] == 0]
    assert all(o["source"] == f"remote tuned table {key} in {store.url}" for o in readers), readers
    assert sum(o["remote"]["tuned"]["publishes"] for o in outs) == 1


def test_a_killed_lock_holder_costs_one_lock_lifetime(store: Server, tmp_path: Path) -> None:
    """The holder is killed (SIGKILL) while measuring: its lock expires, a waiting host takes it and tunes itself."""
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, str(WORKER), "hold"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=host_env(tmp_path, "holder", store.url, HWPROFILE_DEVICE="gb300", FLEET_LOCK_TTL="2",
                                           FLEET_READY=str(ready)))
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()
            time.sleep(0.05)
        waiter = subprocess.Popen([sys.executable, str(WORKER), "tune"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=host_env(tmp_path, "waiter", store.url, HWPROFILE_DEVICE="gb300", FLEET_LOCK_WAIT="60"))
        lines: list[str] = []
        waiting = threading.Event()

        def read_stderr() -> None:
            assert waiter.stderr is not None
            for line in waiter.stderr:
                lines.append(line)
                if "is held in the remote store" in line:
                    waiting.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        assert waiting.wait(120), "".join(lines)  # the waiter waits for the live holder (which renews its lock) ...
        time.sleep(1)
        holder.send_signal(signal.SIGKILL)  # ... until the holder dies
        assert waiter.stdout is not None
        stdout = waiter.stdout.read()
        waiter.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        holder.kill()
        holder.communicate()
    stderr = "".join(lines)
    out = output(subprocess.CompletedProcess(waiter.args, waiter.returncode, stdout, stderr))
    assert out["measured"] > 0 and not out["skipped"] and out["seconds"] < 30, (out, stderr)
    assert "pid" in stderr and "waiting up to 60 s" in stderr


def test_a_live_holder_past_the_bound_leaves_the_values_in_place(store: Server, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    from tests.tune.helpers import FakeTimer

    monkeypatch.setenv(_env.DEVICE.name, "gb300")
    monkeypatch.setenv(_env.DISABLE_PLUGINS.name, "myengine")
    hwprofile.reset()
    key = _remote.tune_lock_key(tuning.device_identity(hwprofile.profile(0).device), "sm100")
    store.client.set(key, "pid 1 on another-host (cafe)", px=60_000)
    timer = FakeTimer()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        result = hwprofile.tune(0, timer=timer, ops=["router_gemm"], lock_timeout=0.5)
    assert timer.calls == [] and "another host (pid 1 on another-host (cafe)) was still tuning" in result.skipped
    assert store.client.get(key) == b"pid 1 on another-host (cafe)"  # never released by a process that does not hold it


# --- trust ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def toy(store: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[KernelSpec, list[str]]:
    """The toy kernel, a private cache directory, and a fake NVRTC that records each compile."""
    site, inc = toy_package(tmp_path / "prefix")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "toy_layer_kernels", raising=False)
    monkeypatch.setenv(_env.CACHE_DIR.name, str(private(tmp_path / "cache")))
    compiles: list[str] = []

    def fake(source: str, name: str, options: Any, exprs: Any, *, what: str) -> tuple[bytes, dict[str, str], str]:
        compiles.extend(exprs)
        return b"\x7fELF toy cubin", {e: f"_Z{len(e)}lowered" for e in exprs}, ""

    monkeypatch.setattr(toolchain, "nvrtc_compile", fake)
    spec = KernelSpec("toy", "toy_layer_kernels", "k.cu", (EXPR, "scale_kernel<3>"), lambda **kw: Launch(EXPR, (1, 1, 1), (32, 1, 1)),
                      options=(f"-I{inc}",), plugin="toy", distribution_version="toy 1.0")
    return spec, compiles


@pytest.mark.parametrize("poison", ["garbage", "flipped byte", "another key's entry", "oversized", "a list"])
def test_a_poisoned_cubin_entry_is_skipped_with_one_warning(poison: str, store: Server, toy: tuple[KernelSpec, list[str]],
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    spec, compiles = toy
    good = _pipeline.compile_spec(spec, "sm_90a", (EXPR,))  # compiled and published
    other = _pipeline.compile_spec(spec, "sm_90a", ("scale_kernel<3>",))
    rkey = _remote.cubin_key(good.key)
    value = store.client.get(rkey)
    bad = {
        "garbage": b"not a cubin at all",
        "flipped byte": value[:-1] + bytes([value[-1] ^ 1]),
        "another key's entry": store.client.get(_remote.cubin_key(other.key)),
        "oversized": value,
        "a list": b"",
    }[poison]
    if poison == "oversized":
        monkeypatch.setattr(_remote, "MAX_CUBIN_BYTES", len(value) - 1)
    if poison == "a list":  # not a string at all: the read script fails for this key only
        store.client.delete(rkey)
        store.client.rpush(rkey, b"x")
    else:
        store.client.set(rkey, bad)
    monkeypatch.setenv(_env.CACHE_DIR.name, str(private(tmp_path / "another-host")))
    hwprofile.reset()
    compiles.clear()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        again = _pipeline.compile_spec(spec, "sm_90a", (EXPR,))
    assert compiles == [EXPR] and not again.cached and again.cubin == good.cubin  # never loaded: compiled here
    warned = [r.getMessage() for r in caplog.records if rkey in r.getMessage()]
    assert len(warned) == 1, warned
    why = {"oversized": "over the", "a list": "WRONGTYPE"}.get(poison, "it is not loaded")
    assert why in warned[0], warned
    assert _remote.counters()["cubin"] == {"hits": 0, "misses": 0, "rejected": 1, "publishes": 1}
    assert _remote.counters()["errors"] == 0 and (_remote.status() or {})["state"] == "in use"  # one bad value, not a bad store
    assert store.client.get(rkey) == value  # the good entry published over the poisoned one


def tuned_table(prof: Any, tmp_path: Path, **changes: Any) -> str:
    from tests.tune.helpers import stale_tuned_file

    return stale_tuned_file(prof, directory=tmp_path / "made", **changes).read_text()


@pytest.fixture
def gb300(store: Server, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(_env.DEVICE.name, "gb300")
    monkeypatch.setenv(_env.DISABLE_PLUGINS.name, "myengine")
    hwprofile.reset()
    return hwprofile.profile(0)


def test_a_fresh_tuned_table_in_the_store_applies(gb300: Any, store: Server, tmp_path: Path) -> None:
    key = _remote.tuned_key(tuning.device_identity(gb300.device), "sm100", "router_gemm")
    table = tuned_table(gb300, tmp_path, date="2026-12-01")
    store.client.set(key, tuned_layers.encode_tuned(table))
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert prof["router_gemm.model"] == tomllib.loads(table)["thresholds"]["router_gemm.model"] != gb300["router_gemm.model"]
    assert prof.explain("router_gemm.model").winner.source == f"remote tuned table {key} in {store.url}"
    assert _remote.counters()["tuned"]["hits"] == 1


def test_a_stale_tuned_table_in_the_store_is_ignored_as_a_stale_file_is(gb300: Any, store: Server, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    key = _remote.tuned_key(tuning.device_identity(gb300.device), "sm100", "router_gemm")
    store.client.set(key, tuned_layers.encode_tuned(tuned_table(gb300, tmp_path)))  # measured against an older fallback
    hwprofile.reset()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        prof = hwprofile.profile(0)
    shipped = prof.explain("router_gemm.model")
    assert prof["router_gemm.model"] == gb300["router_gemm.model"] and shipped.winner.source != f"remote tuned table {key} in {store.url}"
    assert next(x.stale for x in shipped.chain if x.source.startswith("remote tuned table")).startswith("fallback function changed")
    assert f"remote tuned table {key} in {store.url} is stale for device 0 (fallback function changed" in caplog.text
    assert "its values are ignored and the shipped ones apply" in caplog.text


@pytest.mark.parametrize("poison", ["no magic", "flipped byte", "another SKU's table", "not TOML"])
def test_a_poisoned_tuned_table_is_skipped_with_one_warning(poison: str, gb300: Any, store: Server, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    key = _remote.tuned_key(tuning.device_identity(gb300.device), "sm100", "router_gemm")
    text = tuned_table(gb300, tmp_path, date="2026-12-01")
    value = {
        "no magic": text.encode(),
        "flipped byte": tuned_layers.encode_tuned(text)[:-2] + b"9\n",
        "another SKU's table": tuned_layers.encode_tuned(text.replace("GB300", "GB200")),
        "not TOML": tuned_layers.encode_tuned("[stamp\n"),
    }[poison]
    store.client.set(key, value)
    hwprofile.reset()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        prof = hwprofile.profile(0)
    assert prof["router_gemm.max_tokens"] == 16
    warned = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(warned) == 1 and "it is not applied" in warned[0], warned
    assert _remote.counters()["tuned"]["rejected"] == 1


# --- a store that is down --------------------------------------------------------------------------------------------


def test_a_store_that_does_not_answer_costs_one_bounded_wait(toy: tuple[KernelSpec, list[str]], monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A server that accepts connections and never answers: one timeout, one warning, then local-only."""
    spec, compiles = toy
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        monkeypatch.setenv(_env.REMOTE.name, f"redis://127.0.0.1:{mute.getsockname()[1]}/0")
        monkeypatch.setenv(_env.REMOTE_TIMEOUT.name, "0.3")
        hwprofile.reset()
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="hwprofile"):
            a = _pipeline.compile_spec(spec, "sm_90a", (EXPR,))
            b = _pipeline.compile_spec(spec, "sm_90a", ("scale_kernel<3>",))
        took = time.monotonic() - t0
    assert compiles == [EXPR, "scale_kernel<3>"] and not a.cached and not b.cached
    assert took < 2.0, took  # one 0.3 s timeout, not one per request (nor redis-py's retries)
    warned = [r.getMessage() for r in caplog.records if "remote store" in r.getMessage()]
    assert len(warned) == 1 and "local kernel cache and tuned files only" in warned[0] and "timeout 0.3 s" in warned[0]
    assert _remote.counters()["errors"] == 1 and (_remote.status() or {})["state"].startswith("not used: ")


def test_a_store_that_is_gone_costs_one_warning(toy: tuple[KernelSpec, list[str]], monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    spec, compiles = toy
    monkeypatch.setenv(_env.REMOTE.name, f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    hwprofile.reset()
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        for expr in spec.instances:
            _pipeline.compile_spec(spec, "sm_90a", (expr,))
    assert compiles == list(spec.instances)
    assert sum("remote store" in r.getMessage() for r in caplog.records) == 1


def test_no_client_package_is_one_error_line_naming_the_extra(toy: tuple[KernelSpec, list[str]], monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    spec, compiles = toy
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis -> ImportError
    with caplog.at_level(logging.WARNING, logger="hwprofile"):
        for expr in spec.instances:
            _pipeline.compile_spec(spec, "sm_90a", (expr,))
    lines = [r for r in caplog.records if "redis package" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR and _remote.install() in lines[0].getMessage()
    assert compiles == list(spec.instances)


# --- show and doctor -------------------------------------------------------------------------------------------------


def test_show_and_doctor_name_the_remote_layer_and_its_counters(store: Server, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from hwprofile import doctor
    from hwprofile.cli import main

    url = f"redis://:hunter2@127.0.0.1:{store.port}/0"
    store.client.config_set("requirepass", "hunter2")
    try:
        monkeypatch.setenv(_env.REMOTE.name, url)
        monkeypatch.setenv(_env.DEVICE.name, "h200")
        hwprofile.reset()
        assert main(["show"]) == 0
        out = capsys.readouterr().out
        assert f"remote store: redis://:***@127.0.0.1:{store.port}/0 ({_env.REMOTE.name}), in use" in out and "hunter2" not in out
        assert "tuned tables 0 hit, " in out and "store error(s)" in out
        assert main(["show", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["remote"]["url"] == f"redis://:***@127.0.0.1:{store.port}/0" and doc["remote"]["tuned"]["misses"] >= 1
        r = doctor.collect()
        check = next(c for c in r.checks if c.name == "remote store")
        assert check.status == "OK" and "Redis 6." in check.detail and "hunter2" not in json.dumps(r.as_dict())
        monkeypatch.setenv(_env.REMOTE.name, f"redis://:wrong@127.0.0.1:{store.port}/0")
        hwprofile.reset()
        check = next(c for c in doctor.collect().checks if c.name == "remote store")
        assert check.status == "WARN" and "wrong" not in check.detail
    finally:
        store.client.execute_command("AUTH", "hunter2")
        store.client.config_set("requirepass", "")


def test_a_table_published_after_this_profile_was_resolved_is_read_under_the_lock(gb300: Any, store: Server, tmp_path: Path) -> None:
    """Another host tuned and released the lock between this profile's resolution and this tune: nothing is measured twice."""
    from hwprofile import sweep
    from tests.tune.helpers import FakeTimer

    grid = sweep.default_grid("router_gemm")
    doc = sweep.run(gb300, "router_gemm", grid, FakeTimer(), box=sweep.box_grid("router_gemm"))
    other = tmp_path / "other-host" / "router_gemm.toml"
    other.parent.mkdir()
    sweep.write(doc, other)
    assert tuned_layers.publish_tuned(gb300.device, "sm100", "router_gemm", other.read_text())
    assert hwprofile.profile(0) is gb300  # resolved before the table was published: router_gemm still looks unmeasured
    timer = FakeTimer()
    result = hwprofile.tune(0, timer=timer, ops=["router_gemm"])
    assert timer.calls == [] and not result.skipped and result.plan.grids == {}
    assert hwprofile.profile(0).explain("router_gemm.model").winner.source.startswith("remote tuned table ")
