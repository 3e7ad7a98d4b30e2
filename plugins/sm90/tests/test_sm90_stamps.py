"""The sm90 plugin's measured thresholds: each carries the stamp of its sweep, shipped as package data, and it holds.

``hwprofile_sm90/measured/OP.toml`` is the head (``[stamp]``, ``[thresholds]``, ``[sweep]`` notes) of the sweep
file ``hwprofile sweep OP`` wrote on the lent H200 (benchmarks/h200/2026-11-30-sweeps-3 for router_gemm,
linear_bf16_fp32 and gemv; -sweeps-4 for fp8_gemv, re-swept against the chunked fallback), with one documented
change: the kernel digest. The plugin reads its stamps from there (``shipped_stamp``), so the fallback a value
records is the one its sweep measured, and a changed fallback in hwprofile makes the value stale at run time.
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
from hwprofile.plugin import OPS, Stamp, Value, profile_for, shipped_stamp, simulated_device

ROOT = Path(__file__).resolve().parents[3]
MEASURED = Path(hwprofile_sm90.__file__).parent / "measured"
SHIPPED = sorted(p.stem for p in MEASURED.glob("*.toml"))
#: the one documented difference: the sweeps ran the source with the never-dispatched hwp90_gemv_bulk in it; the
#: shipped copies record the source without it, whose dispatched code was proven byte-identical (hwprofile_sm90 says how)
SWEPT_KERNEL = "49c753f4f64ace9faa49ac065430a40407a4ba6e93a1e61a1bfe8167a7782d18"
SHIPPED_KERNEL = "076d38e963e57221f44eea98f5eba96efb3528670d54e2279b35d8e6921888f0"
H200 = simulated_device((9, 0), "NVIDIA H200")


def shipped() -> dict[str, Any]:
    return hwprofile_sm90.hwprofile_settings(H200, {})


def stamped() -> dict[str, Value]:
    return {k: v for k, v in shipped().items() if isinstance(v, Value) and v.stamp is not None}


def arch_layer(prof: Any, key: str) -> Any:
    return next(layer for layer in prof.explain(key).chain if layer.kind == "arch")


def raw_sweep(op: str) -> str:
    """The raw sweep a shipped file names (its header comment), checked against the sweeps behind the shipped values."""
    found = re.search(r"^# Raw sweep \(hwprofile repository, every measurement\): (\S+)$", (MEASURED / f"{op}.toml").read_text(), re.M)
    assert found, f"measured/{op}.toml does not name its raw sweep"
    # fp8_gemv was re-swept against the chunked, fp32-accumulating fallback (-sweeps-4); the others are -sweeps-3's
    assert found.group(1) == f"benchmarks/h200/2026-11-30-sweeps-{4 if op == 'fp8_gemv' else 3}/{op}.toml"
    return found.group(1)


def test_one_shipped_file_per_op_with_a_kernel_and_it_ships() -> None:
    ops_with_kernels = sorted(op for op in profile_for(H200).kernels if op in OPS)
    assert SHIPPED == ops_with_kernels == sorted({v.stamp.op for v in stamped().values() if v.stamp is not None})
    pyproject = tomllib.loads((ROOT / "plugins" / "sm90" / "pyproject.toml").read_text())
    assert "measured/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["hwprofile_sm90"]


@pytest.mark.parametrize("op", SHIPPED)
def test_shipped_file_is_its_raw_sweep_but_the_documented_kernel_digest(op: str) -> None:
    raw = tomllib.loads((ROOT / raw_sweep(op)).read_text())
    text = (MEASURED / f"{op}.toml").read_text()
    ours = tomllib.loads(text)
    assert set(ours) == {"stamp", "thresholds", "sweep"}, "the head only: no [[measurements]]"
    assert raw["stamp"]["kernel"] == SWEPT_KERNEL and ours["stamp"]["kernel"] == SHIPPED_KERNEL
    assert ours["stamp"] == {**raw["stamp"], "kernel": SHIPPED_KERNEL}  # fallback, libraries, device, plugin, date as swept
    assert ours["thresholds"] == raw["thresholds"]
    assert ours["sweep"] == {k: v for k, v in raw["sweep"].items() if k != "samples"}
    assert f"recorded kernel {SWEPT_KERNEL[:12]}" in text, "the file says why its digest differs from the sweep's"


def test_every_stamped_value_carries_the_stamp_of_its_shipped_file() -> None:
    for key, v in stamped().items():
        op = key.split(".")[0]
        assert v.stamp is shipped_stamp("hwprofile_sm90", f"measured/{op}.toml", op=op), key
        assert isinstance(v.stamp, Stamp) and key in OPS[op].bound_keys(), f"{key}: a stamp covers the bounds of the op's kernel region"


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
    assert swept == OPS["gemv"].fallback == "torch.nn.functional.linear"
    before = shipped_stamp("hwprofile_sm90", "measured/gemv.toml")
    monkeypatch.setattr(OPS["gemv"], "fallback", "a newer gemv fallback")
    hwprofile.reset()  # forgets the stamps read so far: they are read again, under the changed table
    caplog.set_level(logging.WARNING)
    prof = profile_for(H200)
    after = shipped_stamp("hwprofile_sm90", "measured/gemv.toml")
    assert after is not before and after == before and after.fallback["function"] == swept
    gemv_keys = sorted(k for k, v in stamped().items() if v.stamp is not None and v.stamp.op == "gemv")
    assert gemv_keys == ["gemv.cublas_roof_n_max", "gemv.cublas_roof_n_min", "gemv.max_k", "gemv.max_n"]
    for key in gemv_keys:
        layer = arch_layer(prof, key)
        assert layer.stamp.fallback["function"] == "torch.nn.functional.linear"
        assert "fallback function changed (torch.nn.functional.linear -> a newer gemv fallback)" in layer.stale, key
    assert prof["gemv.max_n"] == 4096  # a stale shipped value still applies, and is reported
    others = [k for k, v in stamped().items() if v.stamp is not None and v.stamp.op != "gemv" and arch_layer(prof, k).stale]
    assert not others, f"only gemv's fallback changed: {others}"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("4 threshold(s) shipped by sm90 0.1.0 are stale" in w and "ops: gemv" in w for w in warnings), warnings
    with pytest.raises(hwprofile.SettingError, match=r"stale keys: gemv\.max_n"):
        profile_for(H200, {"HWPROFILE_STRICT": "1"})


CORE_FIRST = """
import hwprofile.plugin as api
api.OPS["gemv"].fallback = "a newer gemv fallback"  # the newer core, loaded before the installed plugin
st = api.profile_for(api.simulated_device((9, 0), "NVIDIA H200")).explain("gemv.max_n").chain[1]
print(st.kind, st.stale)
"""


def test_an_older_plugin_beside_a_newer_core_reports_the_change() -> None:
    """Released that way: the core's table changed before the plugin is imported or asked for its values (a stamp that
    took its fallback from the table when the plugin built it could never notice)."""
    out = subprocess.run([sys.executable, "-c", CORE_FIRST], capture_output=True, text=True, check=True).stdout.strip()
    assert out.startswith("arch ") and "fallback function changed (torch.nn.functional.linear -> a newer gemv fallback)" in out, out
