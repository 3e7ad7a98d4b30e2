"""Cross-rank agreement without processes: what is compared, with which scope, and what the error says.

The transport (gloo across processes, the bring-up command, timeouts) is in test_gloo.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import pytest

import hwprofile
from hwprofile import device as _device
from hwprofile.errors import AgreementError, HwprofileError
from hwprofile.optable import TABLE
from hwprofile.plugin import rule_model
from hwprofile.profiles import Profile, build_profile
from hwprofile.registry import Registry
from tests.conftest import tuned_toml

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from hwprofile import distributed as hd  # noqa: E402 - after the skips: the package needs torch at call time only
from hwprofile.distributed import _collective, _compare, _summary  # noqa: E402 - private parts, where they live

ROUTER = "setting.router_gemm.max_tokens"
ENGINE = "myengine-hwprofile " + metadata.version("myengine-hwprofile")  # the example downstream plugin as installed


def environment(sim: str, env: Mapping[str, str] | None) -> dict[str, str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_") or k in ("HWPROFILE_CACHE_DIR", "HWPROFILE_CONFIG_DIR")
    }
    return {**environ, "HWPROFILE_DEVICE": sim, **(env or {})}


def resolve(environ: Mapping[str, str], index: int = 0) -> Profile:
    return build_profile(_device.detect(environ).device(index), Registry(environ).load_entry_points(), environ)


def summary(rank: int, env: Mapping[str, str] | None = None, *, sim: str = "h200", index: int = 0, host: str = "node-a") -> hd.RankSummary:
    """What rank ``rank`` would send: its profile resolved from a private environment."""
    environ = environment(sim, env)
    prof = resolve(environ, index)
    entries = hd.profile_entries(prof, environ)
    return hd.RankSummary(
        rank=rank,
        host=host,
        local_rank=rank,
        device_index=index,
        device_name=prof.device.name,
        device_sm=prof.device.sm,
        plugin=prof.plugin.label if prof.plugin else "none",
        target=prof.target or "-",
        fingerprint=prof.fingerprint,
        digest=hd.entries_digest(entries, prof.fingerprint).hex(),
        entries=entries,
        disabled=hd.disabled_plugins(environ),
    )


@pytest.fixture(scope="module")
def same() -> hd.RankSummary:
    return summary(0)


def keys(diffs: list[hd.Difference]) -> list[str]:
    return [d.key for d in diffs]


def test_equal_profiles_have_equal_digests_and_no_difference(same: hd.RankSummary) -> None:
    other = summary(1, host="node-b")
    assert other.digest == same.digest
    diffs, models = hd.compare([same, other])
    assert diffs == [] and models == {("NVIDIA H200", "sm_90"): (0, 1)}


def test_what_is_compared(same: hd.RankSummary) -> None:
    e = same.entries
    for key in (
        "hwprofile",
        "torch",
        "nvrtc",
        "device.name",
        "device.capability",
        "plugin",
        "plugin.target",
        "plugin.sm90",
        "plugin.myengine",
        "setting.deterministic",
        "setting.strict",
        ROUTER,
        "env.CUDA_MODULE_LOADING",
        "kernel.router_gemm",
        "kernel.gemv",
    ):
        assert key in e, key
    assert e["setting.deterministic"].scope == e["setting.strict"].scope == "job"
    assert e["device.name"].scope == "model" and e[ROUTER].scope == "device" and e["plugin.sm90"].scope == "present"
    assert e["plugin.myengine"].scope == "job" and e["torch"].value == torch.__version__
    assert "myengine-hwprofile" in e[ROUTER].source and e[ROUTER].value == "8"


def test_user_env_override_on_one_rank_is_named_with_its_variable(same: hd.RankSummary) -> None:
    odd = summary(2, {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "4"}, host="node-b")
    assert odd.digest != same.digest
    diffs, _ = hd.compare([same, summary(1), odd])
    assert keys(diffs) == [ROUTER]
    (d,) = diffs
    assert d.values() == {"8": (0, 1), "4": (2,)} and d.scope == "device"  # the key decides the scope, not who set it
    assert "HWPROFILE_ROUTER_GEMM_MAX_TOKENS" in d.holdings[1].sources[0] and "myengine-hwprofile" in d.holdings[0].sources[0]
    assert dict(d.holdings[1].hosts) == {"node-b": (2,)}
    msg = _compare._message(diffs, [same, odd], {("NVIDIA H200", "sm_90"): (0, 2)}, "error")
    assert "router_gemm.max_tokens" in msg and "HWPROFILE_ROUTER_GEMM_MAX_TOKENS" in msg and "host node-b" in msg


def test_same_value_from_another_layer_is_not_a_difference(same: hd.RankSummary) -> None:
    """Provenance is reported, never compared: equal values dispatch alike."""
    other = summary(1, {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "8"})
    diffs, _ = hd.compare([same, other])
    assert diffs == [] and other.entries[ROUTER].source != same.entries[ROUTER].source


def test_deterministic_and_env_default_overrides_differ(same: hd.RankSummary) -> None:
    odd = summary(1, {"HWPROFILE_DETERMINISTIC": "1", "CUDA_MODULE_LOADING": "EAGER"})
    diffs, _ = hd.compare([same, odd])
    assert keys(diffs) == ["setting.deterministic", "env.CUDA_MODULE_LOADING"]
    assert "set by the user" in diffs[1].holdings[1].sources[0]


def test_blocked_plugin_names_the_variable(same: hd.RankSummary) -> None:
    odd = summary(1, {"HWPROFILE_DISABLE_PLUGINS": "myengine"})
    diffs, _ = hd.compare([same, odd])
    assert "plugin.myengine" in keys(diffs) and ROUTER in keys(diffs)
    d = next(d for d in diffs if d.key == "plugin.myengine")
    assert d.values() == {ENGINE: (0,), "(absent)": (1,)}
    assert "HWPROFILE_DISABLE_PLUGINS=myengine" in d.holdings[1].sources[0]


def test_blocked_arch_plugin_leaves_core_defaults(same: hd.RankSummary) -> None:
    odd = summary(1, {"HWPROFILE_DISABLE_PLUGINS": "sm90"})
    diffs, _ = hd.compare([same, odd])
    assert {"plugin", "plugin.target", "kernel.gemv"} <= set(keys(diffs))
    assert "plugin.sm90" not in keys(diffs)  # an architecture plugin's version is compared where present; "plugin" names the gap
    plugin = next(d for d in diffs if d.key == "plugin")
    assert plugin.values() == {"sm90": (0,), "none": (1,)} and "HWPROFILE_DISABLE_PLUGINS" in plugin.holdings[1].sources[0]


def test_tuned_file_on_one_rank(same: hd.RankSummary, tmp_path: Path) -> None:
    prof = resolve(environment("h200", None))
    assert prof.plugin is not None
    kernel = prof.kernels["router_gemm"].source_digest()
    f = tmp_path / "router.toml"
    f.write_text(
        tuned_toml(prof.device, {"router_gemm.max_tokens": 12}, plugin=prof.plugin.name, version=prof.plugin.version or "", kernel=kernel)
    )
    odd = summary(1, {"HWPROFILE_TUNED_FILE": str(f)})
    diffs, _ = hd.compare([same, odd])
    assert keys(diffs) == [ROUTER]
    assert diffs[0].values() == {"8": (0,), "12": (1,)} and f"tuned file {f}" in diffs[0].holdings[1].sources[0]


def test_stale_tuned_file_is_shown_as_ignored(same: hd.RankSummary, tmp_path: Path) -> None:
    """A rank whose tuned file is stale runs the shipped value: that agrees, and the summary says what was ignored."""
    f = tmp_path / "stale.toml"
    f.write_text(
        tuned_toml(
            _device.simulated_detection("h200").device(0),
            {"router_gemm.max_tokens": 12},
            plugin="sm90",
            version="0.1.0",
            fallback_function="another fallback",
        )
    )
    odd = summary(1, {"HWPROFILE_TUNED_FILE": str(f)})
    assert hd.compare([same, odd])[0] == []
    assert "ignored" in odd.entries[ROUTER].source and str(f) in odd.entries[ROUTER].source


def test_plugin_version_difference(same: hd.RankSummary) -> None:
    wire = same.to_wire()
    wire["rank"] = 1
    wire["entries"]["plugin.myengine"] = ("myengine-hwprofile 99.0", "downstream plugin (takes part in every profile)", "job")
    odd = hd.RankSummary.from_wire(wire)
    diffs, _ = hd.compare([same, odd], "allow")
    assert keys(diffs) == ["plugin.myengine"] and diffs[0].values() == {ENGINE: (0,), "myengine-hwprofile 99.0": (1,)}


def test_mixed_models_error_and_allow() -> None:
    ranks = [summary(0, sim="h200"), summary(1, sim="h200"), summary(2, sim="gb300"), summary(3, sim="gb300")]
    diffs, models = hd.compare(ranks, "error")
    assert keys(diffs)[:2] == ["device.capability", "device.name"] and "plugin" in keys(diffs) and "kernel.gemv" in keys(diffs)
    assert models == {("NVIDIA H200", "sm_90"): (0, 1), ("NVIDIA GB300", "sm_103"): (2, 3)}
    msg = _compare._message(diffs, ranks, models, "error")
    assert "mixed='allow'" in msg and "NVIDIA GB300 (sm_103)" in msg
    assert hd.compare(ranks, "allow")[0] == []
    # allowed models must still agree within each model: an override on one GB300 rank is caught among the GB300 ranks
    ranks[3] = summary(3, {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "4"}, sim="gb300")
    diffs, _ = hd.compare(ranks, "allow")
    assert keys(diffs) == [ROUTER] and diffs[0].values() == {"8": (2,), "4": (3,)}
    # the same user choice on every rank agrees, also where another model's plugin does not know the key
    env = {"TORCH_CUDA_ARCH_LIST": "9.0a;10.3a", "HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "4"}
    same_choice = [summary(r, env, sim=m) for r, m in enumerate(("h200", "h200", "gb300", "gb300"))]
    assert same_choice[0].entries["env.TORCH_CUDA_ARCH_LIST"].scope == "device"
    only_sm90 = hd.Entry('"1"', "set by the user (default '0' from hwprofile-sm90 0.1.0 not applied)", "present")
    same_choice[:2] = [s.replace(entries={**s.entries, "env.SM90_ONLY": only_sm90}) for s in same_choice[:2]]
    assert hd.compare(same_choice, "allow")[0] == []
    assert keys(hd.compare(same_choice, "error")[0])[:2] == ["device.capability", "device.name"]
    # ... and a model-dependent key that differs inside one model is caught, naming only that model's ranks
    ranks[3] = summary(3, {"HWPROFILE_DISABLE_PLUGINS": "sm100"}, sim="gb300")
    plugin = next(d for d in hd.compare(ranks, "allow")[0] if d.key == "plugin")
    assert plugin.values() == {"sm100": (2,), "none": (3,)}


def test_mixed_allow_compares_values_never_provenance() -> None:
    """An H200 rank's override equal to what its plugin gives H200 is no difference, with GB300 ranks holding their own value."""
    plain = [summary(0, sim="h200"), summary(2, sim="gb300"), summary(3, sim="gb300")]
    # a setting the two models' plugins give different values (found, not assumed: plugin values change)
    key = next(
        k for k, e in plain[0].entries.items()
        if k.startswith("setting.") and k in plain[1].entries and e.value != plain[1].entries[k].value and e.source.startswith("arch")
    )
    var = "HWPROFILE_" + key.removeprefix("setting.").replace(".", "_").upper()
    text = plain[0].entries[key].value  # canonical text: a str setting (a cost model) as JSON writes it, the variable holds it bare
    override = summary(1, {var: json.loads(text) if text.startswith('"') else text}, sim="h200")
    assert override.entries[key].source.startswith("env")  # the same value from another layer
    ranks = [plain[0], override, *plain[1:]]
    assert hd.compare(ranks, "allow")[0] == []
    # a different value within one model is still caught, naming only that model's ranks
    odd = summary(1, {"HWPROFILE_GEMV_MAX_K": "1024"}, sim="h200")
    (d,) = hd.compare([plain[0], odd, *plain[1:]], "allow")[0]
    assert d.key == "setting.gemv.max_k" and set(d.values()) == {plain[0].entries["setting.gemv.max_k"].value, "1024"}
    assert sorted(r for h in d.holdings for r in h.ranks) == [0, 1]


def test_mixed_models_of_one_architecture() -> None:
    """H100 and H200 share the sm90 plugin: besides the model's name, only what it derives from each card's peak bandwidth
    differs: the cost models it states by the bandwidth rule (``hwprofile.plugin.rule_model``), which predict each card's
    own times and so may route differently. Those are device keys: ``mixed="allow"`` compares them among ranks of one model."""
    ranks = [summary(0, sim="h100"), summary(1, sim="h200")]
    profs = [resolve(environment(sim, None)) for sim in ("h100", "h200")]
    # the ops whose model is the bandwidth rule on both cards (found, not assumed: a re-sweep ships a measured model)
    ruled = [op for op in TABLE if all(p[f"{op}.model"] == rule_model(op, p.device, sku="-").value for p in profs)]
    assert "moe_gate" in ruled  # the fused gate is not swept yet
    diffs = hd.compare(ranks, "error")[0]
    assert sorted(keys(diffs)) == sorted(["device.name", *(f"setting.{op}.model" for op in ruled)])
    for d in diffs:
        if d.key != "device.name":  # each rank holds its own card's rule
            op = d.key.removeprefix("setting.").removesuffix(".model")
            assert d.values() == {json.dumps(rule_model(op, p.device, sku="-").value): (r,) for r, p in enumerate(profs)}
    assert hd.compare(ranks, "allow")[0] == []


def test_arch_plugin_versions_compare_across_models() -> None:
    a, b = summary(0, sim="h100"), summary(1, sim="h200")
    wire = b.to_wire()
    wire["entries"]["plugin.sm90"] = ("hwprofile-sm90 0.2.0", "architecture plugin selected for sm_90", "present")
    diffs, _ = hd.compare([a, hd.RankSummary.from_wire(wire)], "allow")
    assert keys(diffs) == ["plugin.sm90"]


def test_equal_keys_but_different_fingerprint_still_disagree(same: hd.RankSummary) -> None:
    wire = same.to_wire()
    wire.update(rank=1, fingerprint="0" * 16, digest="1" * 64)
    diffs, _ = hd.compare([same, hd.RankSummary.from_wire(wire)])
    assert keys(diffs) == ["fingerprint"]


def test_mixed_is_validated() -> None:
    with pytest.raises(ValueError, match="'error'.*'allow'"):
        hd.check_agreement(mixed="yes")
    with pytest.raises(ValueError, match="mixed='warn'"):
        hd.compare([], "warn")
    for bad in (0, -1, float("nan"), timedelta(seconds=-2)):
        with pytest.raises(ValueError, match=r"positive number of seconds \(float\('inf'\) waits without a limit\)"):
            hd.check_agreement(timeout=bad)
    for bad in (True, "30", [5]):
        with pytest.raises(ValueError, match="give a number of seconds"):
            hd.check_agreement(timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gather=1"):
        hd.check_agreement(gather=1)  # type: ignore[arg-type]
    assert _collective._seconds(float("inf")) == float("inf") and _collective._seconds(timedelta(minutes=1)) == 60.0
    assert _collective._seconds(None) is None


def test_record_is_128_bytes_and_carries_the_arguments() -> None:
    """The record holds the whole SHA-256 digest (the verdict), the fingerprint as text (the table) and the arguments."""
    assert hd.RECORD_BYTES == 128
    rec = _collective._RECORD.pack(_collective._PROTOCOL, 0, 1, 1, float("nan"), 3, 2, b"\x01" * 32, b"0123456789abcdef", b"node-a")
    fields = _collective._RECORD.unpack(rec)
    assert fields[7] == b"\x01" * 32 and _collective._text(fields[8]) == "0123456789abcdef" and _collective._text(fields[9]) == "node-a"
    assert _collective._timeout_text(fields[4]) == "None" and _collective._timeout_text(float("inf")) == "float('inf')"


def test_needs_an_initialised_process_group() -> None:
    assert not dist.is_initialized()
    with pytest.raises(HwprofileError, match="init_process_group"):
        hd.check_agreement()


def test_rank_ranges() -> None:
    assert _compare._ranks([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7, 8"
    assert _compare._ranks([3]) == "3"


def test_agreement_error_is_exported_lazily() -> None:
    assert hwprofile.AgreementError is AgreementError and issubclass(AgreementError, hwprofile.HwprofileError)
    code = (
        "import sys, hwprofile; hwprofile.AgreementError; assert 'torch' not in sys.modules and 'hwprofile.distributed' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_package_imports_no_torch_and_runs_as_a_module() -> None:
    """The package's import stays torch-free, and ``-m`` runs ``__main__`` once (the package never imports it)."""
    code = (
        "import sys, hwprofile.distributed as hd; hd.check_agreement, hd.main; "
        "assert 'torch' not in sys.modules and 'hwprofile.distributed.__main__' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    p = subprocess.run([sys.executable, "-W", "error", "-m", "hwprofile.distributed", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--mixed" in p.stdout and not p.stderr, p.stderr


def test_local_device_follows_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    if "torch" in sys.modules:  # on a GPU host earlier tests initialised CUDA, and then torch's current device wins
        monkeypatch.setattr(sys.modules["torch"].cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200,gb300,rtx-pro-6000")
    hwprofile.reset()
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert hd.resolve_device(None, cuda_backend=False) == 2
    assert hd.resolve_device(1, cuda_backend=False) == 1
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(HwprofileError, match="LOCAL_RANK=5 but this process sees only 3"):
        hd.resolve_device(None, cuda_backend=False)
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")  # one visible device (a per-rank CUDA_VISIBLE_DEVICES): device 0
    assert hd.resolve_device(None, cuda_backend=False) == 0


class _FakeCuda:
    def __init__(self, current: int, count: int) -> None:
        self.current, self.count = current, count

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return self.current

    def device_count(self) -> int:
        return self.count


class _FakeTorch:
    def __init__(self, current: int, count: int) -> None:
        self.cuda = _FakeCuda(current, count)


def test_cuda_ranks_check_their_current_device(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """With CUDA in use the current device wins; a rank left on device 0 of an 8-GPU host is warned, once."""
    monkeypatch.setattr(_summary, "_warned_devices", set())
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(3, 8))
    with caplog.at_level("WARNING", logger="hwprofile.distributed"):
        assert hd.resolve_device(None, cuda_backend=True) == 3
        assert not caplog.records
        monkeypatch.setitem(sys.modules, "torch", _FakeTorch(0, 8))
        assert hd.resolve_device(None, cuda_backend=True) == 0
        assert hd.resolve_device(None, cuda_backend=False) == 0  # CUDA initialised: the current device, too
    (rec,) = caplog.records
    assert "LOCAL_RANK=3" in rec.getMessage() and "torch.cuda.set_device(local_rank)" in rec.getMessage()


def test_bringup_main_single_rank_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The bring-up command's own code, in this process, as a one-rank torchrun job would run it."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HWPROFILE_DEVICE", "gb300")
    hwprofile.reset()
    assert hd.main(["--backend", "gloo", "--json", "--timeout", "30"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["agree"] and doc["models"] == [{"name": "NVIDIA GB300", "sm": "sm_103", "ranks": [0]}]
    assert doc["ranks"][0]["plugin"].startswith("sm100 (hwprofile-sm100 ") and not dist.is_initialized()
    # again, in the same process: a new process group and a new profile, nothing stale from the first run
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    assert hd.main(["--backend", "gloo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"][0]["name"] == "NVIDIA H200"
    assert all(ref() is None for ref, *_ in _collective._groups.values())  # no process group kept alive after destroy_process_group


@pytest.mark.parametrize(("gpus", "local", "asked", "want"), [(1, 2, "auto", "gloo"), (2, 2, "auto", "nccl"), (0, 1, "auto", "gloo"),
                                                          (1, 2, "nccl", None), (0, 1, "nccl", None), (8, 2, "gloo", "gloo")])
def test_bringup_backend_needs_a_gpu_per_local_rank(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                    gpus: int, local: int, asked: str, want: str | None) -> None:
    """NCCL fails ("invalid usage") when two ranks share a GPU: auto picks gloo then, and an explicit nccl is a usage error."""
    import torch

    for k, v in {"RANK": "0", "WORLD_SIZE": str(local), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(local),
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    chosen: list[str] = []

    class Stop(Exception):
        pass

    def init(backend: str, **kw: object) -> None:
        chosen.append(backend)
        raise Stop

    monkeypatch.setattr(dist, "init_process_group", init)
    if want is None:
        assert hd.main(["--backend", asked]) == 2
        err = capsys.readouterr().err
        assert "needs one GPU per rank" in err and f"runs {local} ranks" in err and "--backend gloo" in err
        assert not chosen
    else:
        assert hd.main(["--backend", asked]) == 1  # a group that cannot form is a clear error, not a traceback
        assert chosen == [want] and "did not all join within --timeout 120 s" in capsys.readouterr().err


def _arrive_all(store: object, key: str, plan: dict[int, tuple[float, float]], ranks: tuple[int, ...]) -> dict[int, object]:
    """Run ``_collective._arrive`` for each rank in a thread: rank -> (delay before arriving, its timeout); what each got."""
    import threading
    import time

    got: dict[int, object] = {}

    def one(rank: int, delay: float, wait_s: float) -> None:
        # each rank its own client, as ranks are processes (threads waiting on one HashStore wake together)
        mine = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))  # type: ignore[attr-defined]
        time.sleep(delay)
        try:
            _collective._arrive(mine, key, rank, ranks, wait_s, False)
            got[rank] = "go"
        except AgreementError as exc:
            got[rank] = exc

    threads = [threading.Thread(target=one, args=(r, *plan[r])) for r in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_arrival_is_one_outcome_for_every_rank() -> None:
    """The store orders arrivals against a give-up: all go, or all raise (a late rank at once), naming only the absent."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    assert _arrive_all(store, "k1/", {0: (0, 5), 1: (0.1, 5), 2: (0.2, 5)}, (0, 1, 2)) == {0: "go", 1: "go", 2: "go"}
    got = _arrive_all(store, "k2/", {0: (0, 0.4), 1: (0.1, 0.6), 2: (1.2, 5)}, (0, 1, 2))
    assert all(isinstance(e, AgreementError) for e in got.values()), got
    assert got[0].missing == got[1].missing == (2,) and got[2].missing == (2,)  # type: ignore[union-attr]
    assert "rank 2 had not called check_agreement (ranks 0, 1 had)" in str(got[0]) and "timeout=0.4 s" in str(got[0])
    assert "rank 0 gave up after waiting" in str(got[1]) and "arrived after the check" in str(got[2])
    # a give-up after every rank was counted is void: rank 1 is counted last but slow to signal; rank 0 goes on
    import threading
    import time

    def slow_last() -> None:
        time.sleep(0.1)
        store.set("k3/a1", "")
        assert store.add("k3/n", 1) == 2
        time.sleep(0.6)  # rank 0 gives up meanwhile (0.3 s), finds every rank counted, and waits for the signal
        store.set("k3/go", "")

    t = threading.Thread(target=slow_last)
    t.start()
    assert _arrive_all(store, "k3/", {0: (0, 0.3)}, (0, 1)) == {0: "go"}
    t.join()
