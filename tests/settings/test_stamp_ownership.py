"""A measured value applies only when its stamp names the op that owns its key (issue 25).

The op owning a key is the op whose settings declare it (``optable.owner``). A tuned file whose stamp
names an op hwprofile does not know, or that sets a key of another op or of no op, is an error naming
the file, the key, the stamp's op and what to do; so is a plugin value whose stamp cannot vouch for
its key. A plugin's own setting (no op owns it) may carry the stamp of a known op.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import hwprofile
from hwprofile import Setting, Value, hookimpl, optable, tuning
from hwprofile.device import DeviceInfo
from hwprofile.errors import PluginError, SettingError
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry
from tests.conftest import tuned_toml

H200 = DeviceInfo(0, "NVIDIA H200", (9, 0), simulated=True)
KEY = "router_gemm.max_tokens"


class Arch:
    @hookimpl
    def hwprofile_arch(self) -> hwprofile.ArchSpec:
        return hwprofile.ArchSpec({(9, 0): "sm_90a"})

    @hookimpl
    def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
        return {KEY: Value(12, "shipped")}


def _reg(*extra: tuple[str, object]) -> Registry:
    reg = Registry({})
    reg.register(Arch(), "arch", distribution="arch-dist", version="1.0")
    for name, obj in extra:
        reg.register(obj, name, distribution=f"{name}-dist", version="2.0")
    return reg


def _file(tmp_path: Path, op: str, thresholds: dict[str, object]) -> Path:
    """A tuned file as a sweep writes it, its stamp's op replaced by ``op`` (a stamp of an unknown op cannot be computed)."""
    text = tuned_toml(H200, thresholds, plugin="arch", version="1.0")
    f = tmp_path / "tuned.toml"
    f.write_text(text.replace('op = "router_gemm"', f'op = "{op}"', 1))
    assert f'op = "{op}"' in f.read_text()
    return f


# --- tuned files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "thresholds", "key", "needles"),
    [
        # the issue's example: an op nobody knows vouches for nothing
        ("bogus_op", {KEY: 4}, KEY, ["op 'bogus_op'", "does not know", "hwprofile sweep router_gemm"]),
        ("Router_Gemm", {KEY: 4}, KEY, ["op 'Router_Gemm'", "does not know"]),
        ("", {KEY: 4}, KEY, ["op ''", "does not know"]),
        # a known op's sweep cannot decide another op's key
        ("gemv", {KEY: 4}, KEY, ["belongs to op router_gemm", "stamp names op 'gemv'", "hwprofile sweep router_gemm"]),
        ("linear_bf16_fp32", {"gemv.max_n": 2048}, "gemv.max_n", ["belongs to op gemv", "op 'linear_bf16_fp32'", "hwprofile sweep gemv"]),
        ("fp8_gemv", {"gemv.split_k": True}, "gemv.split_k", ["belongs to op gemv", "op 'fp8_gemv'"]),
        # one foreign key among the op's own: the file is refused, not half applied
        ("router_gemm", {KEY: 4, "router_gemm.max_n": 384, "gemv.max_k": 2048}, "gemv.max_k", ["belongs to op gemv"]),
        # keys no op owns: a sweep never writes them
        ("router_gemm", {"strict": False}, "strict", ["belongs to no op", "HWPROFILE_STRICT"]),
        ("gemv", {"deterministic": True}, "deterministic", ["belongs to no op", "HWPROFILE_DETERMINISTIC"]),
    ],
)
def test_untied_tuned_value_is_an_error_naming_file_key_and_op(
    tmp_path: Path, op: str, thresholds: dict[str, object], key: str, needles: list[str]
) -> None:
    f = _file(tmp_path, op, thresholds)
    env = {"HWPROFILE_TUNED_FILE": str(f)}
    with pytest.raises(SettingError) as e:
        build_profile(H200, _reg(), env)
    msg = str(e.value)
    assert msg.startswith(f"tuned file {f}: [thresholds] sets {key},"), msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    with pytest.raises(SettingError, match=re.escape(f"sets {key},")):
        tuning.read_tuned(f)


def test_untied_file_in_the_tuned_directory_is_refused_too(tmp_path: Path) -> None:
    d = Path(tuning.tuned_dir(H200, {"HWPROFILE_CONFIG_DIR": str(tmp_path)}))
    d.mkdir(parents=True)
    (d / "router_gemm.toml").write_text(_file(tmp_path, "bogus_op", {KEY: 4}).read_text())
    with pytest.raises(SettingError, match=r"router_gemm.toml: \[thresholds\] sets router_gemm.max_tokens,.*'bogus_op'"):
        build_profile(H200, _reg(), {"HWPROFILE_CONFIG_DIR": str(tmp_path)})


def test_the_process_profile_refuses_the_issue_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported path: hwprofile.profile() with HWPROFILE_TUNED_FILE, which set router_gemm.max_tokens before."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_TUNED_FILE", str(_file(tmp_path, "bogus_op", {KEY: 4})))
    hwprofile.reset()
    with pytest.raises(SettingError, match="bogus_op"):
        hwprofile.profile(0)


@pytest.mark.parametrize(
    ("op", "thresholds"),
    [
        ("router_gemm", {KEY: 3, "router_gemm.min_n": 256, "router_gemm.max_n": 384}),
        ("gemv", {"gemv.max_n": 2048, "gemv.cublas_roof_n_min": 0, "gemv.cublas_roof_n_max": 0}),
    ],
)
def test_a_tuned_value_of_its_own_op_applies(tmp_path: Path, op: str, thresholds: dict[str, object]) -> None:
    text = tuned_toml(H200, thresholds, plugin="arch", version="1.0", op=op)
    f = tmp_path / "ok.toml"
    f.write_text(text)
    prof = build_profile(H200, _reg(), {"HWPROFILE_TUNED_FILE": str(f)})
    for key, value in thresholds.items():
        assert prof[key] == value and prof.explain(key).winner.kind == "tuned"


def test_every_threshold_a_sweep_writes_is_tied_to_its_op() -> None:
    """What ``hwprofile sweep OP`` writes is what ``read_tuned`` accepts for OP: the rule refuses nothing a sweep makes."""
    from hwprofile import sweep

    for op, d in optable.OPS.items():
        points = [sweep.Point(m, n, k, [1.0] * 3, [2.0] * 3) for m, n, k in d.grid]  # the kernel wins everywhere
        written = set(sweep.thresholds_for(op, points, "fallback")[0])
        assert written, op
        for keys in (written, set(d.bound_keys())):  # an op whose bounds are constants declares no bound key
            assert all(tuning.untied(k, op, tuned=True) == "" for k in keys), op
            assert all(optable.owner(k) is d for k in keys)


# --- values plugins ship with a stamp ------------------------------------------------------------


def _stamp(op: str) -> tuning.Stamp:
    return tuning.Stamp(op, tuning.device_identity(H200), (9, 0), "arch", "1.0", "", {})


def _stamping(values: dict[str, object], declare: list[Setting] | None = None) -> object:
    class Down:
        @hookimpl
        def hwprofile_declare_settings(self) -> list[Setting]:
            return declare or []

        @hookimpl
        def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
            return values

    return Down()


@pytest.mark.parametrize(
    ("key", "op", "needles"),
    [
        (KEY, "bogus_op", ["op 'bogus_op'", "does not know"]),
        (KEY, "gemv", ["belongs to op router_gemm", "stamp names op 'gemv'", "shipped_stamp(__name__, 'measured/router_gemm.toml'"]),
        ("gemv.max_n", "fp8_gemv", ["belongs to op gemv", "op 'fp8_gemv'", "measured/gemv.toml"]),
        ("down.threshold", "bogus_op", ["op 'bogus_op'", "does not know"]),  # a plugin's own setting: only a known op
    ],
)
def test_untied_plugin_value_is_an_error_naming_the_plugin(key: str, op: str, needles: list[str]) -> None:
    down = _stamping({key: Value(8, "measured", _stamp(op))}, [Setting("down.threshold", "int", 1, "x")])
    with pytest.raises(SettingError) as e:
        build_profile(H200, _reg(("down", down)), {})
    msg = str(e.value)
    assert msg.startswith(f"plugin down (down-dist 2.0) gives {key} a value its stamp cannot vouch for"), msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_a_plugin_setting_of_its_own_may_carry_a_known_ops_stamp() -> None:
    """The documented choice for keys no op owns: a plugin's value derived from an op's sweep follows that op's staleness."""
    down = _stamping({"down.threshold": Value(8, "derived from the router sweep", _stamp("router_gemm"))},
                     [Setting("down.threshold", "int", 1, "x")])
    prof = build_profile(H200, _reg(("down", down)), {})
    assert prof["down.threshold"] == 8 and prof.explain("down.threshold").winner.stamp == _stamp("router_gemm")


def test_a_plugin_value_stamped_by_its_own_op_applies() -> None:
    down = _stamping({KEY: Value(8, "measured", _stamp("router_gemm")), "gemv.max_n": Value(1024, "measured", _stamp("gemv"))})
    prof = build_profile(H200, _reg(("down", down)), {})
    assert prof[KEY] == 8 and prof["gemv.max_n"] == 1024


def test_every_stamp_the_installed_plugins_ship_is_tied_to_its_key() -> None:
    reg = Registry({}).load_entry_points()
    seen = 0
    for p in reg.arch_plugins:
        assert p.arch is not None
        for cc, target in p.arch.targets.items():
            prof = build_profile(DeviceInfo(0, f"Simulated {target}", cc, simulated=True), reg, {})
            for key, s in prof.settings.items():
                for layer in s.chain:
                    if isinstance(layer.stamp, tuning.Stamp):
                        seen += 1
                        assert tuning.untied(key, layer.stamp.op, tuned=False) == "", (p.name, key, layer.stamp.op)
    if not seen:
        pytest.skip("no installed plugin ships stamped values")


def test_a_shipped_sweep_file_of_an_unknown_op_is_a_plugin_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.plugin import shipped_stamp

    pkg = tmp_path / "stamped_pkg"
    (pkg / "measured").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "measured" / "router_gemm.toml").write_text(_file(tmp_path, "bogus_op", {KEY: 4}).read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stamped_pkg", raising=False)
    hwprofile.reset()
    with pytest.raises(PluginError, match=r"stamped_pkg.*router_gemm.toml.*sets router_gemm.max_tokens.*'bogus_op'"):
        shipped_stamp("stamped_pkg", "measured/router_gemm.toml")


# --- the rule itself -----------------------------------------------------------------------------


def test_owner_is_the_op_that_declares_the_key() -> None:
    for d in optable.OPS.values():
        for decl in d.settings:
            assert optable.owner(decl[0]) is d
        for b in d.bound_keys():
            assert optable.owner(b) is d
    assert optable.owner("strict") is None and optable.owner("myengine.fused_shared_experts") is None
    assert optable.owner("router_gemm.no_such") is None


def test_untied_in_words() -> None:
    assert tuning.untied(KEY, "router_gemm", tuned=True) == "" == tuning.untied(KEY, "router_gemm", tuned=False)
    assert "does not know" in tuning.untied(KEY, "bogus_op", tuned=False)
    assert "belongs to op router_gemm" in tuning.untied(KEY, "gemv", tuned=False)
    assert "belongs to no op" in tuning.untied("eng.x", "gemv", tuned=True)
    assert tuning.untied("eng.x", "gemv", tuned=False) == ""  # a plugin's own setting, derived from a known op's sweep
