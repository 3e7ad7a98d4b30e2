"""The sm90 plugin's measured thresholds: each carries the stamp of its sweep, shipped as package data, and it holds.

``hwprofile_sm90/measured/OP.toml`` holds the ``[stamp]`` and the per-shape table (``OP.measured``) that
``hwprofile sweep OP`` wrote on the lent H200 (the catalog run benchmarks/h200/2026-12-02-catalog-2/tuned), and the
cost model (``OP.model``) fitted from that run's samples (benchmarks/ship_sm90.py). The plugin reads its stamps from
there (``shipped_stamp``), so the fallback a value records is the one its sweep measured, and a changed fallback in
hwprofile makes the value stale at run time. An op whose fallback changed after the sweep ships no table until it is
re-swept: ``hwprofile_sm90.predicted()`` names it, and its model is the bandwidth rule.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import hwprofile
import hwprofile_sm90
from hwprofile import costmodel, tuning
from hwprofile.plugin import OPS, PREBUILT_SHAPES, OpDef, Stamp, Value, profile_for, rule_model, shipped_stamp, simulated_device

ROOT = Path(__file__).resolve().parents[3]
MEASURED = Path(hwprofile_sm90.__file__).parent / "measured"
SHIPPED = sorted(p.stem for p in MEASURED.glob("*.toml"))
RAW = "benchmarks/h200/2026-12-02-catalog-2/tuned"
H200 = simulated_device((9, 0), "NVIDIA H200")


def shipped() -> dict[str, Any]:
    return hwprofile_sm90.hwprofile_settings(H200, {})


def stamped() -> dict[str, Value]:
    return {k: v for k, v in shipped().items() if isinstance(v, Value) and v.stamp is not None}


def arch_layer(prof: Any, key: str) -> Any:
    return next(layer for layer in prof.explain(key).chain if layer.kind == "arch")


def raw_sweep(op: str) -> str:
    """The raw sweep a shipped file names (its header comment): the catalog run's tuned file, beside its samples."""
    header = r"^# Raw sweep \(hwprofile repository, every measurement\): (\S+) and (\S+)$"
    found = re.search(header, (MEASURED / f"{op}.toml").read_text(), re.M)
    assert found, f"measured/{op}.toml does not name its raw sweep"
    assert found.group(1) == f"{RAW}/{op}.toml" and found.group(2) == f"samples/{op}.toml"
    return found.group(1)


def test_every_op_with_a_kernel_ships_its_sweep_or_says_it_is_predicted() -> None:
    ops_with_kernels = sorted(op for op in profile_for(H200).kernels if op in OPS)
    assert not set(SHIPPED) & set(hwprofile_sm90.predicted()), "an op is either measured against today's fallback or predicted"
    assert sorted([*SHIPPED, *hwprofile_sm90.predicted()]) == ops_with_kernels
    assert SHIPPED == sorted({v.stamp.op for v in stamped().values() if v.stamp is not None})
    pyproject = tomllib.loads((ROOT / "plugins" / "sm90" / "pyproject.toml").read_text())
    assert "measured/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["hwprofile_sm90"]


@pytest.mark.parametrize("op", sorted(set(hwprofile_sm90.predicted()) & set(PREBUILT_SHAPES)))  # ops of its own the H200 run swept
def test_an_op_swept_against_an_old_fallback_is_predicted_not_stale(op: str, caplog: pytest.LogCaptureFixture) -> None:
    """Its sweep recorded a fallback the op table no longer names: shipping it would warn at every start."""
    raw = tomllib.loads((ROOT / RAW / f"{op}.toml").read_text())
    assert raw["stamp"]["fallback"]["function"] != OPS[op].fallback, f"{op}'s sweep measured today's fallback: ship it"
    caplog.set_level(logging.WARNING)
    prof = profile_for(H200)
    layer = arch_layer(prof, costmodel.model_key(op))
    assert layer.stamp is None and "not measured on an H200 against today's" in layer.reason
    assert prof[tuning.measured_key(op)] == "", "no per-shape table: nothing measured against this fallback"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "stale" in r.getMessage()]


def test_an_op_added_to_the_table_needs_no_change_to_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op the table gained since the H200 run has no measured/OP.toml: the plugin states the bandwidth rule for its model
    (no stamp: nothing was measured), never a missing-file error; an op that declares no model gets nothing from it."""
    from hwprofile import optable

    def toy(name: str, settings: tuple[Any, ...]) -> OpDef:
        return OpDef(name, "toy", args=("x", "w"), w_dtype="bfloat16", out_dtype="float32", fallback="f", max_m=16, min_n=1,
                     max_n=4096, min_k=8, max_k=8192, threshold="max_tokens", grid=((1, 256, 512),), settings=settings,
                     family=None, backward=None)

    modelled = toy("toy_op", ((costmodel.model_key("toy_op"), "str", "", "its cost model", True, None, None),))
    for d in (modelled, toy("toy_bare", ())):
        monkeypatch.setitem(OPS, d.name, d)
        monkeypatch.setitem(optable.TABLE, d.name, d)
    hwprofile.reset()
    values = shipped()
    got, rule = values["toy_op.model"], rule_model("toy_op", H200, sku=H200.name)
    assert (got.value, got.stamp) == (rule.value, None) and "toy_op" in hwprofile_sm90.predicted()
    assert "not measured on an H200 against today's toy_op fallback" in got.reason and not (MEASURED / "toy_op.toml").exists()
    assert not [k for k in values if k.startswith(("toy_bare.", "toy_op.measured"))]
    assert sorted({v.stamp.op for v in stamped().values() if v.stamp is not None}) == SHIPPED, "the shipped files, unchanged"


@pytest.mark.parametrize("op", SHIPPED)
def test_shipped_file_is_its_raw_sweep_with_the_model_fitted_from_its_samples(op: str) -> None:
    raw = tomllib.loads((ROOT / raw_sweep(op)).read_text())
    ours = tomllib.loads((MEASURED / f"{op}.toml").read_text())
    assert set(ours) == {"stamp", "thresholds"}, "the stamp and the decisions only: no [[measurements]]"
    assert ours["stamp"] == raw["stamp"], "fallback, libraries, device, plugin, kernel, plan and date as swept"
    mkey, model = tuning.measured_key(op), costmodel.model_key(op)
    assert set(ours["thresholds"]) == {mkey, model}, "the kernel's limits are the op table's, not a sweep's"
    assert ours["thresholds"][mkey] == raw["thresholds"][mkey]
    rows = tomllib.loads((ROOT / RAW / tuning.SAMPLES_DIR / f"{op}.toml").read_text())["measurements"]
    samples = [costmodel.Sample(r["m"], r["n"], r["k"], r["kernel_us"] if r["kernel_us"] > 0 else None, r["fallback_us"]) for r in rows]
    assert ours["thresholds"][model] == costmodel.format_model(costmodel.fit(op, samples)), "benchmarks/ship_sm90.py refits it"


def test_every_stamped_value_carries_the_stamp_of_its_shipped_file() -> None:
    for key, v in stamped().items():
        op = key.split(".")[0]
        assert v.stamp is shipped_stamp("hwprofile_sm90", f"measured/{op}.toml", op=op), key
        assert isinstance(v.stamp, Stamp) and key in (tuning.measured_key(op), costmodel.model_key(op)), f"{key}: a sweep decides"


@pytest.mark.parametrize("op", SHIPPED)
def test_shipped_values_are_the_thresholds_their_sweep_chose(op: str) -> None:
    thresholds = tomllib.loads((MEASURED / f"{op}.toml").read_text())["thresholds"]
    values = shipped()
    assert {k: values[k].value for k in thresholds} == thresholds
    assert all(values[k].stamp is not None for k in thresholds), "a value the sweep chose ships with its stamp"


def test_importing_the_plugin_reads_no_sweep_file() -> None:
    code = "import sys, hwprofile_sm90; print('tomllib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False", "the stamps are read inside hwprofile_settings, not at import"


@pytest.mark.parametrize("key", sorted(stamped()))
def test_shipped_thresholds_are_not_stale_for_this_source(key: str) -> None:
    """An edit of kernels/sm90_gemv.cu (or a header it includes) marks every threshold stale: re-sweep, or prove
    the dispatched code unchanged before recording the new source digest in the shipped files."""
    layer = arch_layer(profile_for(H200), key)
    assert layer.stamp is not None and not layer.stale, f"{key}: {layer.stale}"


def test_a_changed_fallback_makes_the_shipped_values_stale_at_run_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The design's first case: an installed hwprofile-sm90 runs beside a newer core whose gemv fallback changed.
    The stamps were read from the sweep files, not from the op table, so the gemv values say so; the others do not."""
    swept = tomllib.loads((MEASURED / "gemv.toml").read_text())["stamp"]["fallback"]["function"]
    shipped_table = shipped()["gemv.measured"].value
    assert swept == OPS["gemv"].fallback == "torch.nn.functional.linear"
    before = shipped_stamp("hwprofile_sm90", "measured/gemv.toml")
    monkeypatch.setattr(OPS["gemv"], "fallback", "a newer gemv fallback")
    hwprofile.reset()  # forgets the stamps read so far: they are read again, under the changed table
    caplog.set_level(logging.WARNING)
    prof = profile_for(H200)
    after = shipped_stamp("hwprofile_sm90", "measured/gemv.toml")
    assert after is not before and after == before and after.fallback["function"] == swept
    gemv_keys = sorted(k for k, v in stamped().items() if v.stamp is not None and v.stamp.op == "gemv")
    assert gemv_keys == ["gemv.measured", "gemv.model"]
    for key in gemv_keys:
        layer = arch_layer(prof, key)
        assert layer.stamp.fallback["function"] == "torch.nn.functional.linear"
        assert "fallback function changed (torch.nn.functional.linear -> a newer gemv fallback)" in layer.stale, key
    assert prof["gemv.measured"] == shipped_table  # a stale shipped value still applies, and is reported
    others = [k for k, v in stamped().items() if v.stamp is not None and v.stamp.op != "gemv" and arch_layer(prof, k).stale]
    assert not others, f"only gemv's fallback changed: {others}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("2 threshold(s) shipped by sm90 0.1.0 are stale" in w and "ops: gemv" in w for w in warnings), warnings
    with pytest.raises(hwprofile.SettingError, match=r"stale keys: gemv\.measured"):
        profile_for(H200, {"HWPROFILE_STRICT": "1"})


CORE_FIRST = """
import hwprofile.plugin as api
api.OPS["gemv"].fallback = "a newer gemv fallback"  # the newer core, loaded before the installed plugin
st = api.profile_for(api.simulated_device((9, 0), "NVIDIA H200")).explain("gemv.measured").chain[1]
print(st.kind, st.stale)
"""


def test_an_older_plugin_beside_a_newer_core_reports_the_change() -> None:
    """Released that way: the core's table changed before the plugin is imported or asked for its values (a stamp that
    took its fallback from the table when the plugin built it could never notice)."""
    out = subprocess.run([sys.executable, "-c", CORE_FIRST], capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("arch ") and "fallback function changed (torch.nn.functional.linear -> a newer gemv fallback)" in out, out
