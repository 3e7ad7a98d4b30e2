"""Selection of exactly one architecture plugin per device, and errors that name the plugin."""

from __future__ import annotations

import types

import pytest

import hwprofile
from hwprofile import ArchSpec, _entrypoints, hookimpl
from hwprofile.device import DeviceInfo
from hwprofile.errors import PluginError
from hwprofile.registry import Registry

H200 = DeviceInfo(0, "NVIDIA H200", (9, 0), simulated=True)
L40S = DeviceInfo(0, "NVIDIA L40S", (8, 9), simulated=True)
SPARK = DeviceInfo(0, "NVIDIA GB10", (12, 1), simulated=True)


def arch_plugin(targets: dict[tuple[int, int], str]) -> object:
    class P:
        @hookimpl
        def hwprofile_arch(self) -> ArchSpec:
            return ArchSpec(targets)

    return P()


@pytest.mark.parametrize(
    ("sim", "plugin", "target"),
    [("h200", "sm90", "sm_90a"), ("h100", "sm90", "sm_90a"), ("b200", "sm100", "sm_100a"), ("gb300", "sm100", "sm_103a"),
     ("b300", "sm100", "sm_103a"), ("rtx-pro-6000", "sm120", "sm_120a"), ("rtx-5090", "sm120", "sm_120a"),
     ("dgx-spark", "sm120", "sm_121a"), ("l40s", None, None), ("a100", None, None)],
)
def test_installed_plugins_select_by_exact_capability(
    no_downstream: None, monkeypatch: pytest.MonkeyPatch, sim: str, plugin: str | None, target: str | None
) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert (prof.plugin.name if prof.plugin else None) == plugin
    assert prof.target == target
    if plugin is None:
        assert "no installed architecture plugin" in prof.selection.reason
        assert prof["router_gemm.max_tokens"] == 16 and prof.settings["router_gemm.max_tokens"].winner.kind == "core"


def test_mixed_host_gets_one_profile_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "gb300,rtx-pro-6000")
    hwprofile.reset()
    assert hwprofile.profile(0).target == "sm_103a"
    assert hwprofile.profile(1).target == "sm_120a"
    assert hwprofile.profile(0) is hwprofile.profile(0)


def test_major_number_alone_never_matches() -> None:
    reg = Registry({})
    reg.register(arch_plugin({(12, 0): "sm_120a"}), "only120")
    assert reg.select(SPARK).plugin is None


def test_two_claims_is_an_error_naming_both() -> None:
    reg = Registry({})
    reg.register(arch_plugin({(9, 0): "sm_90a"}), "a", distribution="dist-a", version="1")
    reg.register(arch_plugin({(9, 0): "sm_90a"}), "b", distribution="dist-b", version="2")
    with pytest.raises(PluginError) as e:
        reg.select(H200)
    assert "dist-a 1" in str(e.value) and "dist-b 2" in str(e.value)
    pinned = Registry({"HWPROFILE_PLUGIN": "b"})
    pinned.register(arch_plugin({(9, 0): "sm_90a"}), "a")
    pinned.register(arch_plugin({(9, 0): "sm_90a"}), "b")
    assert pinned.select(H200).plugin.name == "b"


def test_pin_that_does_not_claim_is_an_error_unless_forced(caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry({"HWPROFILE_PLUGIN": "a"})
    reg.register(arch_plugin({(9, 0): "sm_90a"}), "a")
    with pytest.raises(PluginError, match="does not claim sm_89.*HWPROFILE_PLUGIN_FORCE=1"):
        reg.select(L40S)
    reg = Registry({"HWPROFILE_PLUGIN": "a", "HWPROFILE_PLUGIN_FORCE": "1"})
    reg.register(arch_plugin({(9, 0): "sm_90a"}), "a")
    sel = reg.select(L40S)
    assert sel.plugin.name == "a" and sel.target == "sm_90a"
    assert "does not claim sm_89" in caplog.text


def test_pin_unknown_plugin_is_an_error() -> None:
    reg = Registry({"HWPROFILE_PLUGIN": "sm999"})
    with pytest.raises(PluginError, match="sm999"):
        reg.select(H200)


def test_disable_blocks_through_pluggy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "sm90, myengine")
    hwprofile.reset()
    prof = hwprofile.profile(0)
    assert prof.plugin is None
    from hwprofile.profiles import registry

    reg = registry()
    assert reg.pm.is_blocked("sm90") and "sm90" not in reg.plugins


def test_misspelt_hook_argument_names_the_plugin() -> None:
    bad = types.SimpleNamespace()

    @hookimpl
    def hwprofile_settings(devise, resolved):  # type: ignore[no-untyped-def]
        return {}

    bad.hwprofile_settings = hwprofile_settings
    with pytest.raises(PluginError, match="(?s)typo.*devise"):
        Registry({}).register(bad, "typo")


def test_unknown_hook_name_is_reported() -> None:
    class P:
        @hookimpl
        def hwprofile_setings(self) -> dict[str, int]:
            return {}

    with pytest.raises(PluginError, match="unknown hook.*hwprofile_setings"):
        Registry({}).register(P(), "p")


def test_hook_that_raises_names_distribution_and_version() -> None:
    class P:
        @hookimpl
        def hwprofile_arch(self) -> ArchSpec:
            raise RuntimeError("boom")

    with pytest.raises(PluginError) as e:
        Registry({}).register(P(), "boomer", distribution="boom-dist", version="9.9")
    assert "boom-dist 9.9" in str(e.value) and "boom" in str(e.value)


def test_broken_entry_point_names_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile import registry

    broken = _entrypoints.EntryPoint("broken", "no_such_module_xyz", "broken-dist", "0.0.1")
    monkeypatch.setattr(registry, "find_entry_points", lambda group: [broken])
    with pytest.raises(PluginError) as e:
        Registry({}).load_entry_points()
    msg = str(e.value)
    assert "broken-dist 0.0.1" in msg and "no_such_module_xyz" in msg and "HWPROFILE_DISABLE_PLUGINS=broken" in msg


def test_fast_entry_point_scan_matches_importlib_metadata() -> None:
    from hwprofile import registry

    key = lambda e: e.name  # noqa: E731
    fast = sorted(registry.find_entry_points(registry.ENTRY_POINT_GROUP), key=key)
    slow = sorted(_entrypoints._entry_points_slow(registry.ENTRY_POINT_GROUP), key=key)
    assert fast == slow and {e.name for e in fast} >= {"sm90", "sm100", "sm120"}


def test_entry_point_attribute_form(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:

    (tmp_path / "ep_mod.py").write_text("class Holder:\n    class Inner:\n        x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _entrypoints.EntryPoint("x", "ep_mod:Holder.Inner", None, None).load().x == 1


def test_invalid_arch_spec_is_rejected() -> None:
    with pytest.raises(PluginError, match="sm_XYa"):
        Registry({}).register(arch_plugin({(9, 0): "compute_90"}), "weird")


def test_egg_info_entry_points_are_read(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile import registry

    egg = tmp_path / "legacy_plugin.egg-info"
    egg.mkdir()
    (egg / "entry_points.txt").write_text("[console_scripts]\nx = y\n\n[hwprofile.plugins]\nlegacy = legacy_mod:Plugin\n")
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: legacy-plugin\nVersion: 2.0.1\n\nbody\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = {e.name: e for e in registry.find_entry_points(registry.ENTRY_POINT_GROUP)}
    assert eps["legacy"] == _entrypoints.EntryPoint("legacy", "legacy_mod:Plugin", "legacy-plugin", "2.0.1")
