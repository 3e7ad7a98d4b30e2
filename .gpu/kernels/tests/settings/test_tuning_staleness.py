"""Staleness people can trust: stale only for a real change, unknown is "cannot tell", and the shipped stamps match the plugins."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import hwprofile
from hwprofile import Value, hookimpl, tuning
from hwprofile.device import DeviceInfo
from hwprofile.errors import SettingError
from hwprofile.optable import OPS
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry
from tests.conftest import tuned_toml

KEY = "router_gemm.max_tokens"
H200 = DeviceInfo(0, "NVIDIA H200", (9, 0), memory_bytes=143771 << 20)  # a real GPU (not simulated)
H100 = DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), memory_bytes=81559 << 20)
FB = {"function": "torch.mm(out_dtype=torch.float32)", "torch": "2.11.0", "cublas": "13.1.0.3", "cublaslt": "13.1.0.3"}


def stamp(**changes: object) -> tuning.Stamp:
    base = tuning.Stamp("router_gemm", tuning.device_identity(H200), (9, 0), "arch", "1.0", "k" * 64, FB, "2026-11-30", plan="p" * 64)
    fb = {**FB, **{k[9:]: v for k, v in changes.items() if k.startswith("fallback_")}}
    rest = {k: v for k, v in changes.items() if not k.startswith("fallback_")}
    return base.replace(fallback=fb, **rest)


@pytest.mark.parametrize(
    ("now", "real", "stale", "notes", "unknown"),
    [
        ({}, True, [], [], []),
        ({"fallback_torch": "2.11.3", "fallback_cublas": "13.1.2.9", "fallback_cublaslt": "13.1.2.9"}, True, [], [], []),  # patch: never
        ({"fallback_torch": "2.13.0+cpu"}, True, ["fallback torch 2.11 -> 2.13"], [], []),
        ({"fallback_torch": "2.13.0+cpu"}, False, [], ["fallback torch 2.11 -> 2.13 (simulated device: not compared)"], []),
        ({"fallback_cublas": "13.2.0", "fallback_cublaslt": "13.2.0"}, True, ["fallback cublas 13.1 -> 13.2"], [], []),
        ({"fallback_torch": "not installed"}, True, [], [], ["fallback torch: cannot tell"]),
        ({"fallback_cublas": "unknown", "fallback_cublaslt": "unknown"}, True, [], [], ["fallback cublas: cannot tell"]),
        ({"fallback_function": "torch.nn.functional.linear"}, True, ["fallback function changed"], [], []),
        ({"device": tuning.device_identity(H100)}, True, [], ["measured on NVIDIA H200 sm_90 140 GiB"], []),
        ({"compute_capability": (10, 0)}, True, ["measured on compute capability 9.0"], [], []),
        ({"plugin_version": "1.1"}, True, [], ["measured with arch 1.0, 1.1 is installed"], []),
        ({"plugin": "other"}, True, ["measured with plugin 'arch', 'other' is selected"], [], []),
        ({"kernel": "j" * 64}, True, ["kernel source changed"], [], []),
        ({"kernel": ""}, True, [], [], ["kernel source: cannot tell"]),
        ({"plan": "q" * 64}, True, ["launch plan changed"], [], []),  # same source, launched differently
        ({"plan": ""}, True, [], [], ["launch plan: cannot tell (none to compare with here"]),
    ],
)
def test_compare_sorts_differences(now: dict[str, object], real: bool, stale: list[str], notes: list[str], unknown: list[str]) -> None:
    c = tuning.compare(stamp(), stamp(**now), real_gpu=real)
    for got, want in ((c.stale, stale), (c.notes, notes), (c.unknown, unknown)):
        assert len(got) == len(want), c
        for g, w in zip(got, want, strict=True):
            assert g.startswith(w), (g, w)
    assert c.is_stale == bool(stale)


def test_a_stamp_without_a_plan_cannot_tell_whether_the_plan_changed() -> None:
    """Stamps written before plans were recorded (the shipped sm90 ones) say so instead of guessing."""
    c = tuning.compare(stamp(plan=""), stamp(), real_gpu=True)
    assert not c.stale and c.unknown == ("launch plan: cannot tell (the stamp records none)",)


def test_stamp_recording_unknown_is_cannot_tell() -> None:
    c = tuning.compare(stamp(fallback_torch="unknown"), stamp(fallback_torch="2.13.0"), real_gpu=True)
    assert not c.stale and c.unknown == ("fallback torch: cannot tell (measured with unknown, here 2.13.0)",)


def _arch(st: tuning.Stamp) -> object:
    class Arch:
        @hookimpl
        def hwprofile_arch(self) -> hwprofile.ArchSpec:
            return hwprofile.ArchSpec({(9, 0): "sm_90a"})

        @hookimpl
        def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
            return {KEY: Value(12, "measured", st), "linear_bf16_fp32.max_tokens": Value(8, "measured", st.replace(op="linear_bf16_fp32"))}

    return Arch()


def _reg(st: tuning.Stamp) -> Registry:
    reg = Registry({})
    reg.register(_arch(st), "arch", distribution="arch-dist", version="1.0")
    return reg


@pytest.fixture
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "_warned_shipped", [False])


def test_shipped_stale_warns_once_per_process_and_still_applies(fresh_warning: None, caplog: pytest.LogCaptureFixture) -> None:
    old = stamp(kernel="", fallback_torch="0.9.0")  # a real change on a real GPU
    caplog.set_level(logging.WARNING)
    for _ in range(3):
        prof = build_profile(H200, _reg(old), {})
    assert prof[KEY] == 12 and "fallback torch 0.9 ->" in prof.explain(KEY).winner.stale
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    msg = warnings[0]
    assert "2 threshold(s) shipped by arch 1.0 are stale on device 0" in msg and "hwprofile explain router_gemm.max_tokens" in msg
    assert len(msg) < 300  # short: explain has the detail


def test_same_capability_other_card_is_a_note_not_a_warning(fresh_warning: None, caplog: pytest.LogCaptureFixture) -> None:
    st = stamp(kernel="").replace(fallback=tuning.fallback_identity("router_gemm"))  # libraries as installed here
    caplog.set_level(logging.WARNING)
    prof = build_profile(H100, _reg(st), {})
    assert prof[KEY] == 12 and prof.explain(KEY).winner.stale == ""
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert tuning.assess(prof, st).notes == ("measured on NVIDIA H200 sm_90 140 GiB",)


def test_simulated_device_never_stale_for_library_versions(fresh_warning: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    prof = build_profile(H200.replace(simulated=True), _reg(stamp(kernel="", fallback_torch="0.9.0")), {})
    assert prof.explain(KEY).winner.stale == "" and not caplog.records


def test_strict_turns_shipped_stale_into_an_error(fresh_warning: None) -> None:
    why = r"strict is on \(environment HWPROFILE_STRICT\): stale values are errors; stale keys: router_gemm.max_tokens, linear_bf16_fp32"
    with pytest.raises(SettingError, match=why):
        build_profile(H200, _reg(stamp(kernel="", fallback_torch="0.9.0")), {"HWPROFILE_STRICT": "1"})


def test_strict_is_read_once_as_the_setting_whatever_layer_sets_it(fresh_warning: None) -> None:
    """Staleness reads the resolved ``strict`` setting (what ops read), not the variable: a layer that sets it counts."""

    class Strict:
        @hookimpl
        def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
            return {"strict": True}

    reg = _reg(stamp(kernel="", fallback_torch="0.9.0"))
    reg.register(Strict(), "strictly", distribution="strictly-dist", version="2.0")
    with pytest.raises(SettingError, match=r"strict is on \(strictly-dist 2.0\): stale values are errors"):
        build_profile(H200, reg, {})
    assert build_profile(H200, reg, {"HWPROFILE_STRICT": "off"}).get("strict", bool) is False  # the user's variable is on top


def test_stale_tuned_file_ignored_and_strict_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "t.toml"
    f.write_text(tuned_toml(H200, {KEY: 3}, plugin="arch", version="1.0", fallback_function="torch.nn.functional.linear"))
    env = {"HWPROFILE_TUNED_FILE": str(f)}
    prof = build_profile(H200, _reg(stamp(kernel="").replace(fallback=tuning.fallback_identity("router_gemm"))), env)
    r = prof.explain(KEY)
    assert r.value == 12 and not r.chain[-1].applied and "fallback function changed" in r.chain[-1].stale
    assert "its values are ignored" in caplog.text
    with pytest.raises(SettingError, match="HWPROFILE_STRICT"):
        build_profile(H200, _reg(stamp(kernel="")), {**env, "HWPROFILE_STRICT": "1"})


def test_cli_table_note_short_and_explain_detail(
    fresh_warning: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hwprofile import cli, profiles

    prof = build_profile(H200, _reg(stamp(kernel="", fallback_torch="0.9.0")), {})
    monkeypatch.setattr(profiles, "profile", lambda device=None: prof)
    assert cli.main(["show"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith(KEY))
    assert row.rstrip().endswith("STALE (see explain)") and len(row) < 140
    assert cli.main(["explain", KEY]) == 0
    out = capsys.readouterr().out
    assert (
        "STALE: fallback torch 0.9 ->" in out
        and "kernel source: cannot tell" in out
        and "re-measure with: hwprofile sweep router_gemm" in out
    )
    assert cli.main(["explain", KEY, "--json"]) == 0
    arch = json.loads(capsys.readouterr().out)["chain"][1]
    assert arch["comparison"]["stale"][0].startswith("fallback torch 0.9 ->") and arch["comparison"]["unknown"]


def test_shipped_sm90_stamps_quiet_on_simulated_h100_and_h200(fresh_warning: None, caplog: pytest.LogCaptureFixture) -> None:
    """The seed's complaint: every sm90 user got a stale warning on every start."""
    caplog.set_level(logging.WARNING)
    for name in ("h200", "h100"):
        env = {"HWPROFILE_DEVICE": name}
        prof = build_profile(hwprofile.detect(env).devices[0], Registry(env).load_entry_points(), env)
        if prof.plugin is None or prof.plugin.name != "sm90":
            pytest.skip("hwprofile-sm90 is not installed")
        assert not [k for k, s in prof.settings.items() if s.winner.stale]
    assert not [r for r in caplog.records if "stale" in r.getMessage()]


def _shipped_stamps() -> list[tuple[str, str, tuning.Stamp, str]]:
    """(plugin, key, stamp, current kernel digest) for every stamped value every installed arch plugin ships."""
    out = []
    reg = Registry({}).load_entry_points()
    for p in reg.arch_plugins:
        assert p.arch is not None
        for cc, target in p.arch.targets.items():
            dev = DeviceInfo(0, f"Simulated {target}", cc, simulated=True)
            prof = build_profile(dev, reg, {})
            for key, s in prof.settings.items():
                for layer in s.chain:
                    if layer.kind == "arch" and isinstance(layer.stamp, tuning.Stamp):
                        spec = prof.kernels.get(layer.stamp.op)
                        digest = spec.source_digest() if spec is not None else ""
                        out.append((f"{p.label} on {target}", key, layer.stamp, digest))
    return out


def test_every_shipped_stamp_matches_the_installed_plugin() -> None:
    """No release ships stale stamps unnoticed: a kernel or version change without re-measuring fails here."""
    stamps = _shipped_stamps()
    reg = Registry({}).load_entry_points()
    wrong = []
    for who, key, st, digest in stamps:
        plugin = reg.plugins.get(st.plugin)
        if plugin is None:
            wrong.append(f"{who}: {key} is stamped by plugin {st.plugin!r}, which is not installed")
            continue
        if st.plugin_version != plugin.version:
            wrong.append(f"{who}: {key} stamped with {st.plugin} {st.plugin_version}, installed {plugin.version}")
        if st.kernel != digest:
            wrong.append(f"{who}: {key} stamped with kernel {st.kernel[:12]}, the shipped kernel is {digest[:12]}: re-measure and re-stamp")
        now = OPS[st.op].fallback if st.op in OPS else None
        if st.fallback.get("function") != now:
            wrong.append(f"{who}: {key} stamped against fallback {st.fallback.get('function')!r}, the op's fallback is {now!r}")
        if plugin.arch is None or st.compute_capability not in plugin.arch.targets:
            wrong.append(f"{who}: {key} measured on {st.compute_capability}, which {st.plugin} does not serve")
    assert not wrong, "\n".join(wrong)


def test_shipped_stamp_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above sees a kernel that changed after stamping."""
    stamps = _shipped_stamps()
    if not stamps:
        pytest.skip("no installed plugin ships stamped values")
    who, key, st, digest = stamps[0]
    assert st.kernel == digest or pytest.fail(f"{who}: {key}: stamp and kernel differ already")
    changed = DeviceInfo(0, "x", st.compute_capability)
    c = tuning.compare(st, st.replace(kernel="0" * 64, device=tuning.device_identity(changed)), real_gpu=True)
    assert any("kernel source changed" in w for w in c.stale)


# --- tuned files: only what resolving needs, size limit ---------------------------------------------


def test_tuned_file_size_limit_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "big.toml"
    f.write_text(tuned_toml(H200, {KEY: 3}) + "\n# " + "x" * tuning.MAX_TUNED_BYTES + "\n")
    env = {"HWPROFILE_TUNED_FILE": str(f)}
    with pytest.raises(SettingError, match=r"big.toml is 1.0 MiB; a tuned file .* at most 1 MiB.*samples/"):
        build_profile(H200, _reg(stamp(kernel="")), env)


def test_old_sweep_files_parse_only_the_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written before samples moved out carry [[measurements]] inline: they are not parsed."""
    import tomllib

    src = Path(__file__).parents[2] / "benchmarks" / "h200" / "2026-11-30-sweeps-2" / "router_gemm.toml"
    text = src.read_text()
    assert "\n[[measurements]]" in text
    parsed: list[int] = []
    real = tomllib.loads
    monkeypatch.setattr(tomllib, "loads", lambda s, **kw: parsed.append(len(s)) or real(s, **kw))
    st, thresholds = tuning.read_tuned(src)
    assert thresholds == {KEY: 16} and st.op == "router_gemm" and st.device.startswith("NVIDIA H200")
    assert parsed == [text.index("\n[[measurements]]")]  # the head only
    # thresholds after a measurement: the head lacks them, so the whole file is parsed
    odd = tmp_path / "odd.toml"
    odd.write_text(text.replace("[thresholds]", "[[measurements]]\nm = 0\n\n[thresholds]", 1))
    parsed.clear()
    assert tuning.read_tuned(odd)[1] == {KEY: 16} and len(parsed) == 2 and parsed[1] == len(odd.read_text())


def test_sweep_writes_samples_outside_the_tuned_dir(tmp_path: Path) -> None:
    from hwprofile import sweep

    doc = {"stamp": stamp().as_dict(), "thresholds": {KEY: 6}, "sweep": {"ties": "fallback"}, "measurements": [{"m": 1, "kernel_us": 1.0}]}
    d = tmp_path / "tuned" / "nvidia-h200-sm-90"
    samples = sweep.write(doc, d / "router_gemm.toml")
    assert samples == d / "samples" / "router_gemm.toml" and "measurements" in samples.read_text()
    head = (d / "router_gemm.toml").read_text()
    assert "measurements" not in head and 'samples = "samples/router_gemm.toml"' in head
    env = {"HWPROFILE_CONFIG_DIR": str(tmp_path)}
    assert tuning.tuned_files(H200, env) == [d / "router_gemm.toml"]  # samples/ is not a tuned file


def test_head_only_parsing_equals_a_full_parse() -> None:
    """The start-up trick's equivalence test: every shipped sweep file gives what a full parse gives."""
    import tomllib

    files = sorted((Path(__file__).parents[2] / "benchmarks" / "h200").glob("*-sweeps*/*.toml"))
    assert len(files) >= 8
    for f in files:
        full = tomllib.loads(f.read_text())
        st, thresholds = tuning.read_tuned(f)
        assert thresholds == full["thresholds"] and st == tuning.Stamp.from_dict(full["stamp"], where=str(f)), f


def test_a_tuned_value_goes_stale_when_the_launch_plan_changes_and_the_source_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Round 7 of the sm90 variants found PDL worth a few % for the persistent GEMV; switching it on
    changes no source, only the plan. A sweep records the plan, so the old threshold is reported stale."""
    pytest.importorskip("hwprofile_sm90")
    import hwprofile
    from hwprofile_sm90 import planning

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    prof = hwprofile.profile()
    spec = prof.kernels["gemv"]
    plan = tuning.plan_digest("gemv", spec)
    assert plan == tuning.plan_digest("gemv", spec)  # a pure function of the plan
    f = tmp_path / "gemv.toml"
    f.write_text(tuned_toml(prof.device, {"gemv.max_n": 2048}, plugin="sm90", version=prof.plugin.version if prof.plugin else "",
                            kernel=spec.source_digest(), op="gemv", plan=plan))
    monkeypatch.setenv("HWPROFILE_TUNED_FILE", str(f))
    hwprofile.reset()
    assert hwprofile.profile().explain("gemv.max_n").value == 2048  # measured against this plan: applied

    real = planning.plan_gemv

    def with_pdl(**kw: object) -> object:
        la = real(**kw)  # type: ignore[arg-type]
        return la if la.pdl else la.replace(pdl=True)

    monkeypatch.setattr(planning, "plan_gemv", with_pdl)
    hwprofile.reset()
    r = hwprofile.profile().explain("gemv.max_n")
    assert r.value != 2048 and not r.chain[-1].applied and "launch plan changed" in r.chain[-1].stale


def test_plan_digest_records_refusals_but_not_a_runaway_configure() -> None:
    """A shape the plan refuses is part of the plan; a configure that recurses (say, into profile()) is a bug, raised."""

    class Spec:
        plugin, package, source, instances = "t", "t", "t.cu", ()

        def __init__(self, exc: BaseException) -> None:
            self.exc = exc

        def configure(self, **kw: object) -> object:
            raise self.exc

    assert len(tuning.plan_digest("gemv", Spec(ValueError("no")))) == 64
    with pytest.raises(RecursionError):
        tuning.plan_digest("router_gemm", Spec(RecursionError("deep")))
