"""Hostile environments and plugins: typos, plugin output, re-entrancy, fork, import time (issue 13).

Plugins here are real modules written to a temporary directory and found through the entry-point
scanner, so each goes through the same loading path as an installed plugin.
"""

from __future__ import annotations

import logging
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import hwprofile
from hwprofile import ArchSpec, Setting, _entrypoints, hookimpl, registry
from hwprofile.device import DeviceInfo
from hwprofile.errors import PluginError, SettingError
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry
from hwprofile.settings import SettingsResolver

H200 = DeviceInfo(0, "NVIDIA H200", (9, 0), simulated=True)


@pytest.fixture
def extra_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Install a plugin module (source text) beside the real ones, as entry point ``name``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    real = registry.find_entry_points

    def install(name: str, source: str) -> None:
        (tmp_path / f"{name}_mod.py").write_text(textwrap.dedent(source))
        monkeypatch.delitem(sys.modules, f"{name}_mod", raising=False)
        ep = _entrypoints.EntryPoint(name, f"{name}_mod", f"hwprofile-{name}", "0.3.1")
        monkeypatch.setattr(registry, "find_entry_points", lambda group: [*real(group), ep])
        hwprofile.reset()

    return install


# --- typos are never silent ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "suggestion"),
    [("HWPROFILE_ROUTER_GEMM_MAX_TOKEN", "HWPROFILE_ROUTER_GEMM_MAX_TOKENS"), ("HWPROFILE_DISABLE_PLUGIN", "HWPROFILE_DISABLE_PLUGINS")],
)
def test_unknown_variable_warns_once_with_the_closest_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, var: str, suggestion: str
) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv(var, "4")
    hwprofile.reset()
    hwprofile.profile(0)
    hwprofile.profile(0)
    lines = [r.getMessage() for r in caplog.records if var + " " in r.getMessage()]
    assert len(lines) == 1 and f"did you mean {suggestion}?" in lines[0]


def test_plugin_declared_variables_are_known(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "rtx-pro-6000")
    monkeypatch.setenv("HWPROFILE_MYENGINE_FUSED_SHARED_EXPERTS", "0")
    hwprofile.reset()
    assert hwprofile.profile(0)["myengine.fused_shared_experts"] is False
    assert "unknown environment variable" not in caplog.text


def test_unknown_name_in_disable_plugins_names_the_installed_ones(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "sm9O")
    hwprofile.reset()
    assert hwprofile.profile(0).plugin.name == "sm90"  # the typo disabled nothing, and says so
    assert "HWPROFILE_DISABLE_PLUGINS names sm9O, which no installed plugin is called" in caplog.text
    assert "sm90" in caplog.text.split("installed plugins:")[1]
    assert "did you mean sm90?" in caplog.text


@pytest.mark.parametrize("value", ["disabled", "", "2"])
def test_control_switch_rejects_values_outside_its_set(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_CACHE", value)
    hwprofile.reset()
    with pytest.raises(SettingError, match=r"HWPROFILE_CACHE=.* is not valid: expected one of 1/0, true/false, yes/no, on/off"):
        hwprofile.profile(0)


def test_declared_keys_with_one_env_name_are_an_error_naming_both() -> None:
    r = SettingsResolver()
    r.declare([Setting("eng.a_b", "int", 1, "x")], by="plugin eng (hwprofile-eng 1.0)", namespace="eng")
    with pytest.raises(SettingError) as e:
        r.declare([Setting("eng.a.b", "int", 1, "y")], by="plugin eng2 (hwprofile-eng2 2.0)", namespace="eng")
    msg = str(e.value)
    assert "hwprofile-eng 1.0" in msg and "hwprofile-eng2 2.0" in msg and "HWPROFILE_ENG_A_B" in msg


def test_hookimpl_matching_no_hook_is_an_error_naming_the_plugin() -> None:
    class Typo:
        @hookimpl
        def hwprofle_settings(self, device: object, resolved: object) -> dict[str, int]:  # the typo under test
            return {"router_gemm.max_tokens": 4}

    with pytest.raises(PluginError, match=r"typo \(hwprofile-typo 1.0\).*hwprofle_settings.*never be called"):
        Registry({}).register(Typo(), "typo", distribution="hwprofile-typo", version="1.0")


# --- plugin output is validated like user input --------------------------------------------------


@pytest.mark.parametrize("name", ["X; touch /tmp/pwned #", "$(id)", "1ABC", "A B", "HWPROFILE_STRICT", "OK\n", "OK\nid"])
def test_env_default_names_must_be_identifiers(extra_plugin, monkeypatch: pytest.MonkeyPatch, name: str) -> None:  # type: ignore[no-untyped-def]
    extra_plugin(
        "evil",
        f"""
        from hwprofile import EnvDefault, hookimpl

        @hookimpl
        def hwprofile_env_defaults(device, settings):
            return {{{name!r}: EnvDefault("1", "why not")}}
    """,
    )
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    with pytest.raises(SettingError, match=r"plugin evil \(hwprofile-evil 0.3.1\)"):
        hwprofile.profile(0)


def test_env_export_quotes_values(extra_plugin, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    extra_plugin(
        "quoting",
        """
        from hwprofile import EnvDefault, hookimpl

        @hookimpl
        def hwprofile_env_defaults(device, settings):
            return {"ENGINE_FLAGS": EnvDefault("a'b $(id) `x`", "tricky value")}
    """,
    )
    monkeypatch.delenv("ENGINE_FLAGS", raising=False)
    from hwprofile.cli import main

    assert main(["env", "--export", "--simulate", "h200"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "ENGINE_FLAGS" in ln)
    import shlex

    assert shlex.split(line) == ["export", "ENGINE_FLAGS=a'b $(id) `x`"]


@pytest.mark.parametrize("targets", [[(9, 0), "sm_90a"], "sm_90a", {}, None])
def test_arch_spec_shapes_are_checked(targets: object) -> None:
    class Bad:
        @hookimpl
        def hwprofile_arch(self) -> ArchSpec:
            return ArchSpec(targets)  # type: ignore[arg-type]

    with pytest.raises(PluginError, match=r"bad \(hwprofile-bad 2.0\): ArchSpec targets must be a non-empty dict"):
        Registry({}).register(Bad(), "bad", distribution="hwprofile-bad", version="2.0")


@pytest.mark.parametrize(
    ("hook", "ret"),
    [("hwprofile_kernels(device, target)", "7"), ("hwprofile_declare_settings()", "7"), ("hwprofile_kernels(device, target)", "'k.cu'")],
)
def test_hook_return_types_are_checked(extra_plugin, monkeypatch: pytest.MonkeyPatch, hook: str, ret: str) -> None:  # type: ignore[no-untyped-def]
    extra_plugin(
        "shape",
        f"""
        from hwprofile import hookimpl

        @hookimpl
        def {hook}:
            return {ret}
    """,
    )
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    with pytest.raises((PluginError, SettingError), match=r"shape \(hwprofile-shape 0.3.1\).*must return a list"):
        hwprofile.profile(0)


@pytest.mark.parametrize(
    ("value", "what"), [("Value(4, 'measured', 'garbage')", "a stamp of type str"), ("Value(4, 123)", "a reason of type int")]
)
def test_value_reason_and_stamp_types_are_checked(extra_plugin, monkeypatch: pytest.MonkeyPatch, value: str, what: str) -> None:  # type: ignore[no-untyped-def]
    extra_plugin(
        "badvalue",
        f"""
        from hwprofile import Value, hookimpl

        @hookimpl
        def hwprofile_settings(device, resolved):
            return {{"router_gemm.max_tokens": {value}}}
    """,
    )
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    with pytest.raises((PluginError, SettingError), match=rf"badvalue \(hwprofile-badvalue 0.3.1\).*{what}"):
        hwprofile.profile(0)


# --- re-entrancy and fork ------------------------------------------------------------------------


def test_profile_called_while_a_plugin_is_imported_names_it(extra_plugin, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    extra_plugin(
        "eager",
        """
        import hwprofile
        PROF = hwprofile.profile()
    """,
    )
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    with pytest.raises(PluginError, match=r"profile\(\) was called while importing plugin eager \(hwprofile-eager 0.3.1\)"):
        hwprofile.profile(0)


def test_profile_called_from_a_hook_names_the_plugin(extra_plugin, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    extra_plugin(
        "loop",
        """
        import hwprofile
        from hwprofile import hookimpl

        @hookimpl
        def hwprofile_settings(device, resolved):
            return {"router_gemm.max_tokens": hwprofile.profile()["router_gemm.max_tokens"]}
    """,
    )
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    with pytest.raises(PluginError, match=r"running hwprofile_settings of plugin loop \(hwprofile-loop 0.3.1\)") as e:
        hwprofile.profile(0)
    assert not isinstance(e.value.__cause__, RecursionError)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # forking with threads is the point
def test_fork_while_another_thread_resolves_leaves_the_child_able_to_profile(extra_plugin, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    extra_plugin(
        "slow",
        """
        import time
        from hwprofile import hookimpl

        @hookimpl
        def hwprofile_settings(device, resolved):
            time.sleep(0.5)
            return None
    """,
    )
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    inside = threading.Event()
    real_build = build_profile

    def build(*a, **k):  # type: ignore[no-untyped-def]
        inside.set()
        return real_build(*a, **k)

    monkeypatch.setattr("hwprofile.profiles.build_profile", build)
    t = threading.Thread(target=hwprofile.profile, args=(0,))
    t.start()
    assert inside.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: must be able to resolve, with a deadline
        code = 1
        try:
            threading.Timer(30, lambda: os._exit(3)).start()
            code = 0 if hwprofile.profile(0).plugin.name == "sm90" else 2
        finally:
            os._exit(code)
    t.join(60)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# --- plugin import time is measured --------------------------------------------------------------


@pytest.mark.hwprofile_per_device  # `plugins` selects for the session's devices
def test_plugin_import_time_is_measured_shown_and_slow_ones_named(
    extra_plugin,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    extra_plugin(
        "sluggish",
        """
        import time
        time.sleep(0.3)
    """,
    )
    monkeypatch.setattr(registry, "SLOW_IMPORT_S", 0.2)
    caplog.set_level(logging.DEBUG, logger="hwprofile")
    from hwprofile.profiles import registry as loaded

    reg = loaded()
    assert reg.import_seconds["sluggish"] >= 0.3 and set(reg.import_seconds) >= {"sm90", "sm100", "sm120", "sluggish"}
    assert "plugin sluggish (hwprofile-sluggish 0.3.1) took 0.3 s to import" in caplog.text
    assert "plugin sm90 (hwprofile-sm90" in caplog.text and "imported and registered in" in caplog.text
    from hwprofile.cli import main

    t0 = time.perf_counter()
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert time.perf_counter() - t0 < 10 and "import ms" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("sluggish"))
    assert float(row.split()[-1]) >= 300


def test_names_with_a_trailing_newline_are_refused() -> None:
    """``$`` in a regex matches before a final newline: every name check must anchor at the very end."""
    with pytest.raises(SettingError):
        Setting("eng.flag\n", "bool", False, "x")
    with pytest.raises(PluginError, match="sm_XYa"):

        class Nl:
            @hookimpl
            def hwprofile_arch(self) -> ArchSpec:
                return ArchSpec({(9, 0): "sm_90a\n"})

        Registry({}).register(Nl(), "nl")
    from hwprofile import scaffold
    from hwprofile.errors import HwprofileError

    with pytest.raises(HwprofileError):
        scaffold.files("sm89\n", "8.9")
