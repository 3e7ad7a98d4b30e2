"""Settings: declarations, the precedence table layer by layer, bad values from each layer, apply_env."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hwprofile
from hwprofile import EnvDefault, Setting, Value, hookimpl, tuning
from hwprofile.device import DeviceInfo
from hwprofile.errors import PluginError, SettingError
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry
from hwprofile.settings import CORE_SETTINGS
from tests.conftest import tuned_toml

H200 = DeviceInfo(0, "NVIDIA H200", (9, 0), simulated=True)
SPARK = DeviceInfo(0, "NVIDIA GB10", (12, 1), simulated=True)
KEY = "router_gemm.max_tokens"


def _registry(env: dict[str, str], *plugins: tuple[str, object]) -> Registry:
    reg = Registry(env)
    for name, obj in plugins:
        reg.register(obj, name, distribution=f"{name}-dist", version="1.0")
    return reg


class Arch:
    @hookimpl
    def hwprofile_arch(self) -> hwprofile.ArchSpec:
        return hwprofile.ArchSpec({(9, 0): "sm_90a"})

    @hookimpl
    def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
        return {KEY: Value(12, "measured against cublas")}

    @hookimpl
    def hwprofile_env_defaults(self, device: DeviceInfo, settings: dict[str, object]) -> dict[str, EnvDefault]:
        return {"TORCH_CUDA_ARCH_LIST": EnvDefault("9.0a", "wgmma")}


def Down(value: int, **opts: bool) -> object:
    class D:
        @hookimpl(**opts)
        def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
            return {KEY: value}

    return D()


def test_precedence_layer_by_layer(tmp_path: Path) -> None:
    tuned = tmp_path / "tuned.toml"
    tuned.write_text(tuned_toml(H200, {KEY: 6}, plugin="arch", version="1.0"))
    steps = [
        ({}, [], 16, "core"),
        ({}, [("arch", Arch())], 12, "arch"),
        ({}, [("arch", Arch()), ("down", Down(10))], 10, "downstream"),
        ({"HWPROFILE_TUNED_FILE": str(tuned)}, [("arch", Arch()), ("down", Down(10))], 6, "tuned"),
        ({"HWPROFILE_TUNED_FILE": str(tuned), "HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "3"}, [("arch", Arch()), ("down", Down(10))], 3, "env"),
    ]
    for env, plugins, value, kind in steps:
        prof = build_profile(H200, _registry(env, *plugins), env)
        r = prof.explain(KEY)
        assert (r.value, r.winner.kind) == (value, kind), (env, plugins)
    assert [layer.kind for layer in r.chain] == ["core", "arch", "downstream", "tuned", "env"]
    assert r.chain[1].source == "arch-dist 1.0" and r.chain[1].reason == "measured against cublas"


def test_pluggy_order_between_downstream_plugins() -> None:
    reg = _registry({}, ("arch", Arch()), ("low", Down(2, trylast=True)), ("high", Down(9, tryfirst=True)), ("mid", Down(5)))
    r = build_profile(H200, reg, {}).explain(KEY)
    assert r.value == 9 and [layer.source for layer in r.chain][-1] == "high-dist 1.0"
    assert [layer.value for layer in r.chain] == [16, 12, 2, 5, 9]


def test_downstream_sees_merged_result_and_can_change_it() -> None:
    seen = {}

    class Watcher:
        @hookimpl
        def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
            seen.update(resolved)
            return {KEY: int(resolved[KEY]) - 1}

    prof = build_profile(H200, _registry({}, ("arch", Arch()), ("w", Watcher())), {})
    assert seen[KEY] == 12 and prof[KEY] == 11


@pytest.mark.parametrize("value", ["abc", "-3", "", "17", "1.5"])
def test_bad_user_env_value_names_variable_value_and_range(value: str) -> None:
    env = {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": value}
    with pytest.raises(SettingError) as e:
        build_profile(H200, _registry(env), env)
    msg = str(e.value)
    assert "HWPROFILE_ROUTER_GEMM_MAX_TOKENS" in msg and repr(value) in msg and "[0, 16]" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("values", "needle"), [({"no.such_key": 1}, "undeclared"), ({KEY: "16"}, "invalid"), ({KEY: 99}, "[0, 16]"), ({KEY: True}, "invalid")]
)
def test_bad_plugin_value_names_plugin_key_and_allowed(values: dict[str, object], needle: str) -> None:
    class Bad:
        @hookimpl
        def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
            return values

    with pytest.raises(SettingError) as e:
        build_profile(H200, _registry({}, ("bad", Bad())), {})
    assert "bad-dist 1.0" in str(e.value) and needle in str(e.value)


def test_bad_tuned_files(tmp_path: Path) -> None:
    cases = [
        ("not = [toml", "not valid TOML"),
        ("[stamp]\n", "no [thresholds]"),
        (f'[thresholds]\n"{KEY}" = 4\n', "no [stamp]"),
        (f'[stamp]\nop = "router_gemm"\n[thresholds]\n"{KEY}" = 4\n', "[stamp] is incomplete"),
        (tuned_toml(H200, {KEY: 400}), "[0, 16]"),
        (tuned_toml(H200, {"no.such": 1}), "sets no.such, which its [stamp] cannot vouch for: no.such belongs to no op"),  # issue 25
    ]
    for text, needle in cases:
        f = tmp_path / "t.toml"
        f.write_text(text)
        env = {"HWPROFILE_TUNED_FILE": str(f)}
        with pytest.raises(SettingError, match=re.escape(needle)):
            build_profile(H200, _registry(env), env)
    env = {"HWPROFILE_TUNED_FILE": str(tmp_path / "missing.toml")}
    with pytest.raises(SettingError, match="not found"):
        build_profile(H200, _registry(env), env)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"compute_capability": [12, 0]}, "compute capability 12.0"),
        ({"plugin": "other"}, "plugin 'other'"),
        ({"fallback_function": "torch.nn.functional.linear"}, "fallback function"),
    ],
)
def test_stale_tuned_file_is_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, change: dict[str, object], needle: str
) -> None:
    f = tmp_path / "t.toml"
    f.write_text(tuned_toml(H200, {KEY: 3}, **change))
    env = {"HWPROFILE_TUNED_FILE": str(f)}
    prof = build_profile(H200, _registry(env, ("arch", Arch())), env)
    r = prof.explain(KEY)
    assert r.value == 12 and r.winner.kind == "arch"  # the shipped value applies
    tuned = r.chain[-1]
    assert tuned.kind == "tuned" and not tuned.applied and needle in tuned.stale
    assert needle in caplog.text and "hwprofile sweep router_gemm" in caplog.text
    with pytest.raises(SettingError, match="HWPROFILE_STRICT"):
        build_profile(H200, _registry(env, ("arch", Arch())), {**env, "HWPROFILE_STRICT": "1"})


def test_fresh_tuned_file_applies_with_its_stamp(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text(tuned_toml(H200, {KEY: 5}))
    env = {"HWPROFILE_TUNED_FILE": str(f)}
    r = build_profile(H200, _registry(env, ("arch", Arch())), env).explain(KEY)
    assert r.value == 5 and r.winner.kind == "tuned" and r.winner.stamp.fallback["function"].startswith("torch.mm")


def test_default_tuned_dir_per_device(tmp_path: Path) -> None:
    from hwprofile.tuning import tuned_dir

    env = {"HWPROFILE_CONFIG_DIR": str(tmp_path)}
    d = tuned_dir(H200, env)
    d.mkdir(parents=True)
    (d / "router_gemm.toml").write_text(tuned_toml(H200, {KEY: 7}))
    assert d.name == "nvidia-h200-sm-90"
    assert build_profile(H200, _registry(env, ("arch", Arch())), env)[KEY] == 7
    assert build_profile(SPARK, _registry(env, ("arch", Arch())), env)[KEY] == 16  # another device's dir


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="the XDG shortcut applies on Linux only")
@pytest.mark.parametrize("xdg", [None, "/srv/xdg-config", "  "])
def test_config_dir_shortcut_agrees_with_platformdirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, xdg: str | None) -> None:
    import os

    import platformdirs

    from hwprofile.tuning import config_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HWPROFILE_CONFIG_DIR", raising=False)
    if xdg is None:
        monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CONFIG_HOME", xdg)
    assert config_dir(os.environ) == platformdirs.user_config_dir("hwprofile")
    assert config_dir({"HWPROFILE_CONFIG_DIR": "/x"}) == "/x"


def test_shipped_threshold_stamp_is_reported_when_fallback_changed(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hwprofile import tuning as stamps

    monkeypatch.setattr(stamps, "_warned_shipped", [False])
    old = stamps.Stamp(
        "router_gemm",
        stamps.device_identity(H200),
        (9, 0),
        "arch",
        "1.0",
        "",
        {"function": "torch.mm(out_dtype=torch.float32)", "torch": "0.0.1"},
    )

    class Stamped:
        @hookimpl
        def hwprofile_arch(self) -> hwprofile.ArchSpec:
            return hwprofile.ArchSpec({(9, 0): "sm_90a"})

        @hookimpl
        def hwprofile_settings(self, device: DeviceInfo, resolved: dict[str, object]) -> dict[str, object]:
            return {KEY: Value(12, "measured", stamp=old)}

    real = H200.replace(simulated=False)  # library versions count only on a real GPU
    r = build_profile(real, _registry({}, ("arch", Stamped())), {}).explain(KEY)
    assert r.value == 12 and "fallback torch 0.0 ->" in r.winner.stale  # reported, still used
    assert "hwprofile sweep OP (ops: router_gemm)" in caplog.text and "router_gemm.max_tokens" in caplog.text


def test_declared_settings_namespace_and_duplicates() -> None:
    class Decl:
        def __init__(self, key: str) -> None:
            self.key = key

        @hookimpl
        def hwprofile_declare_settings(self) -> list[Setting]:
            return [Setting(self.key, "bool", False, "x")]

    prof = build_profile(H200, _registry({}, ("eng", Decl("eng.flag"))), {})
    assert prof["eng.flag"] is False and prof.explain("eng.flag").setting.env_var == "HWPROFILE_ENG_FLAG"
    with pytest.raises(SettingError, match="outside its namespace"):
        build_profile(H200, _registry({}, ("eng", Decl("other.flag"))), {})
    with pytest.raises(SettingError, match="declared twice: by hwprofile core and by router_gemm"):
        build_profile(H200, _registry({}, ("router_gemm", Decl(KEY))), {})


@given(st.text(max_size=8))
def test_int_parsing_never_returns_out_of_bounds(text: str) -> None:
    s = next(x for x in CORE_SETTINGS if x.key == KEY)
    try:
        v = s.parse(text, origin="X")
    except SettingError as e:
        assert "X=" in str(e)
    else:
        assert isinstance(v, int) and 0 <= v <= 16


@given(st.sampled_from(["1", "true", "YES", "on", "0", "false", "No", "OFF"]))
def test_bool_parsing(text: str) -> None:
    s = next(x for x in CORE_SETTINGS if x.key == "deterministic")
    assert s.parse(text, origin="X") is (text.lower() in ("1", "true", "yes", "on"))


@pytest.mark.parametrize("user", ["0", "", "false", "12.0a"])
def test_apply_env_never_overwrites_a_set_variable(user: str) -> None:
    prof = build_profile(H200, _registry({}, ("arch", Arch())), {})
    env = {"TORCH_CUDA_ARCH_LIST": user}
    assert prof.apply_env(env) == {} and env["TORCH_CUDA_ARCH_LIST"] == user
    env2: dict[str, str] = {}
    assert prof.apply_env(env2) == {"TORCH_CUDA_ARCH_LIST": "9.0a"} == env2


def test_env_default_type_is_checked() -> None:
    class Bad:
        @hookimpl
        def hwprofile_env_defaults(self, device: DeviceInfo, settings: dict[str, object]) -> dict[str, object]:
            return {"X": "1"}

    with pytest.raises(PluginError, match="EnvDefault"):
        build_profile(H200, _registry({}, ("bad", Bad())), {})


# --- the real plugins and the example downstream package ----------------------------------------


@pytest.mark.parametrize(
    ("sim", "arch"), [("h200", "9.0a"), ("b200", "10.0a"), ("gb300", "10.3a"), ("rtx-pro-6000", "12.0a"), ("dgx-spark", "12.1a")]
)
def test_real_plugins_ship_their_values(no_downstream: None, monkeypatch: pytest.MonkeyPatch, sim: str, arch: str) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert prof[KEY] == 16  # the router kernel's M limit, whichever layer states it
    model = prof.explain("router_gemm.model").winner  # what decides inside it: the plugin's cost model
    assert model.kind == "arch" and model.source.startswith(f"hwprofile-{prof.plugin.name if prof.plugin else '?'} ")
    if sim == "h200":  # measured: stamped by the H200 sweep, against the fp32-output fallback
        assert isinstance(model.stamp, tuning.Stamp) and model.stamp.fallback["function"] == "torch.mm(out_dtype=torch.float32)"
    else:  # unmeasured: the bandwidth rule, saying so
        assert model.stamp is None and "not measured on SM1" in model.reason
    assert prof.env_defaults["TORCH_CUDA_ARCH_LIST"].value == arch
    assert prof.settings["gemv.split_k"].value is True and not prof.settings["gemv.split_k"].setting.bit_identical
    assert "HWPROFILE_GEMV_SPLIT_K=0" in prof.settings["gemv.split_k"].winner.reason


@pytest.mark.parametrize(
    ("sim", "fused"), [("rtx-pro-6000", True), ("dgx-spark", True), ("h200", False), ("gb300", False), ("l40s", False)]
)
def test_downstream_example_case_two(monkeypatch: pytest.MonkeyPatch, sim: str, fused: bool) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    r = prof.explain("myengine.fused_shared_experts")
    assert r.value is fused
    assert r.winner.source.startswith("myengine-hwprofile") if fused else r.winner.kind == "declared"
    assert prof[KEY] == 8 and prof.explain(KEY).winner.source.startswith("myengine-hwprofile")
    for user in ("0", "1"):
        monkeypatch.setenv("HWPROFILE_MYENGINE_FUSED_SHARED_EXPERTS", user)
        hwprofile.reset()
        r = hwprofile.profile(0).explain("myengine.fused_shared_experts")
        assert r.value is (user == "1") and r.winner.kind == "env"
    env = {"MYENGINE_FUSED_SHARED_EXPERTS": "0"}
    assert prof.apply_env(env).get("MYENGINE_FUSED_SHARED_EXPERTS") is None and env["MYENGINE_FUSED_SHARED_EXPERTS"] == "0"


def test_profile_json_has_required_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "dgx-spark")
    hwprofile.reset()
    d = json.loads(json.dumps(hwprofile.profile(0).as_dict(), default=str))
    assert d["device"]["compute_capability"] == [12, 1] and d["device"]["simulated"] is True
    assert d["plugin"]["name"] == "sm120" and d["plugin"]["distribution"] == "hwprofile-sm120" and d["plugin"]["nvrtc_arch"] == "sm_121a"
    assert d["plugin"]["version"]


def test_fingerprint_stable_and_sensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    a = hwprofile.profile(0).fingerprint
    hwprofile.reset()
    assert hwprofile.profile(0).fingerprint == a
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MAX_TOKENS", "4")
    hwprofile.reset()
    assert hwprofile.profile(0).fingerprint != a
