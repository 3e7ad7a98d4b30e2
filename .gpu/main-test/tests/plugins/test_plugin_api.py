"""The plugin-author API (hwprofile.plugin) and the hook-call order that selection and layering rely on."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import hwprofile
from hwprofile import _state, plugin
from hwprofile.errors import PluginError
from hwprofile.plugin import ArchSpec, DeviceInfo, EnvDefault, KernelSpec, Launch, Setting, Value, hookimpl
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _recorder(name: str, calls: list[tuple[str, str]], arch: ArchSpec | None = None, **marks: bool) -> object:
    """A plugin whose every hook records (hook, plugin name) and contributes something visible.

    ``marks`` (tryfirst / trylast) go on every hook: pluggy orders each hook's implementations apart.
    """

    class P:
        if arch is not None:

            @hookimpl
            def hwprofile_arch(self) -> ArchSpec:
                calls.append(("hwprofile_arch", name))
                return arch

        @hookimpl(**marks)
        def hwprofile_declare_settings(self) -> list[Setting]:
            calls.append(("hwprofile_declare_settings", name))
            return [Setting(f"{name}.seen", "str", "", "what this plugin saw of the layers below")]

        @hookimpl(**marks)
        def hwprofile_settings(self, device: DeviceInfo, resolved: Mapping[str, Any]) -> dict[str, Any]:
            calls.append(("hwprofile_settings", name))
            below = resolved["router_gemm.max_tokens"]
            return {"router_gemm.max_tokens": Value(below - 1, f"{name} takes one off"), f"{name}.seen": str(below)}

        @hookimpl(**marks)
        def hwprofile_env_defaults(self, device: DeviceInfo, settings: Mapping[str, Any]) -> dict[str, EnvDefault]:
            calls.append(("hwprofile_env_defaults", name))
            return {"WHO": EnvDefault(name, "last writer wins")}

        @hookimpl(**marks)
        def hwprofile_kernels(self, device: DeviceInfo, target: str) -> list[KernelSpec]:
            calls.append(("hwprofile_kernels", name))
            return []

    return P()


def test_hook_call_order_that_selection_and_layering_rely_on() -> None:
    calls: list[tuple[str, str]] = []
    reg = Registry({})
    # Registration order differs from layer order on purpose: pluggy ranks trylast < plain < tryfirst.
    reg.register(_recorder("first", calls, tryfirst=True), "first")
    reg.register(_recorder("arch", calls, ArchSpec({(9, 0): "sm_90a"})), "arch")
    reg.register(_recorder("other", calls, ArchSpec({(10, 0): "sm_100a"})), "other")
    reg.register(_recorder("plain", calls), "plain")
    reg.register(_recorder("last", calls, trylast=True), "last")
    assert calls == [("hwprofile_arch", "arch"), ("hwprofile_arch", "other")]  # at registration, once each
    calls.clear()
    environ = {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "3"}
    prof = build_profile(plugin.simulated_device((9, 0)), reg, environ)
    layers = ["arch", "last", "plain", "first"]  # the other arch plugin never takes part
    assert calls == (
        [("hwprofile_kernels", p) for p in layers]  # first: kernel digests decide staleness of measured values
        + [("hwprofile_declare_settings", p) for p in layers]
        + [("hwprofile_settings", p) for p in layers]
        + [("hwprofile_env_defaults", p) for p in layers]
    )
    assert [prof[f"{p}.seen"] for p in layers] == ["16", "15", "14", "13"]  # each layer saw the one below it
    chain = prof.explain("router_gemm.max_tokens").chain
    assert [(layer.kind, layer.source) for layer in chain] == [
        ("core", "hwprofile core"), ("arch", "plugin arch"), ("downstream", "plugin last"),
        ("downstream", "plugin plain"), ("downstream", "plugin first"), ("env", "environment HWPROFILE_ROUTER_GEMM_MAX_TOKENS"),
    ]
    assert prof.get("router_gemm.max_tokens", int) == 3  # the user still wins over every plugin
    assert prof.env_defaults["WHO"].value == "first"  # the highest-priority plugin's default


def test_a_raise_in_a_hook_names_the_plugin() -> None:
    class Broken:
        @hookimpl
        def hwprofile_settings(self, device: DeviceInfo, resolved: Mapping[str, Any]) -> None:
            raise ZeroDivisionError("bad arithmetic")

    reg = Registry({})
    reg.register(Broken(), "broken", distribution="broken-dist", version="1.0")
    with pytest.raises(PluginError, match=r"broken \(broken-dist 1.0\) raised in hwprofile_settings: ZeroDivisionError") as e:
        build_profile(plugin.simulated_device((9, 0)), reg, {})
    assert isinstance(e.value.__cause__, ZeroDivisionError)


def test_profile_for_uses_the_installed_plugins_without_the_machines_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MAX_TOKENS", "1")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "sm90")
    prof = plugin.profile_for(plugin.simulated_device((9, 0)))
    assert prof.plugin is not None and prof.plugin.name == "sm90" and prof.target == "sm_90a"
    assert prof.explain("router_gemm.max_tokens").winner.kind != "env"
    assert plugin.profile_for(plugin.simulated_device((9, 0)), {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "1"})["router_gemm.max_tokens"] == 1


def test_exports_are_the_records_hwprofile_exports() -> None:
    for name in ("ArchSpec", "DeviceInfo", "EnvDefault", "KernelSpec", "Launch", "PluginInfo", "Setting", "Value", "hookimpl"):
        assert getattr(plugin, name) is getattr(hwprofile, name), name
    assert len(set(plugin.__all__)) == len(plugin.__all__) and all(hasattr(plugin, n) for n in plugin.__all__)
    assert Launch("k", (1, 1, 1), (32, 1, 1)).shared_bytes == 0


def test_every_export_is_documented_in_the_module_docstring() -> None:
    doc = plugin.__doc__ or ""
    missing = [n for n in plugin.__all__ if f"``{n}``" not in doc and f"``{n}(" not in doc]
    assert not missing, f"exported by hwprofile.plugin, not in its docstring: {missing}"
    guide = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    assert not [n for n in plugin.__all__ if f"`{n}" not in guide], "every export is in docs/writing-a-plugin.md"


def test_op_facts_are_the_op_tables() -> None:
    from hwprofile import optable

    assert plugin.OPS is optable.OPS and plugin.op_def("gemv") is optable.GEMV and plugin.OpDef is optable.OpDef
    assert (plugin.NO_SCALE, plugin.TENSOR_SCALE, plugin.ROW_SCALE) == (optable.NO_SCALE, optable.TENSOR_SCALE, optable.ROW_SCALE)
    with pytest.raises(KeyError, match="known ops: router_gemm"):
        plugin.op_def("gemm")


SWEPT = {
    "op": "gemv", "device": "NVIDIA H200 sm_90 140 GiB", "compute_capability": [9, 0], "plugin": "arch", "plugin_version": "1.0",
    "kernel": "k" * 64, "fallback": {"function": "the fallback the sweep measured", "torch": "2.11.0", "cublas": "13.1.0.3",
                                     "cublaslt": "13.1.0.3"}, "date": "2026-11-30", "plan": "p" * 64,
}


@pytest.fixture
def plugin_pkg(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, pathlib.Path]]:
    """An importable plugin package (name, directory) to ship sweep files in; forgotten afterwards."""
    import sys

    name = f"shipping_plugin_{abs(hash(tmp_path)) % 10**8}"
    d = tmp_path / name
    (d / "measured").mkdir(parents=True)
    (d / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, d
    sys.modules.pop(name, None)


def test_shipped_stamp_reads_the_stamp_sweep_wrote(plugin_pkg: tuple[str, pathlib.Path]) -> None:
    """The file `hwprofile sweep OP` writes, shipped as it is: the stamp is the measurement's, fallback included,
    whatever the op table says now; read once per (package, file) until hwprofile.reset()."""
    from hwprofile import sweep

    name, d = plugin_pkg
    doc = {"stamp": SWEPT, "thresholds": {"gemv.max_n": 4096}, "sweep": {"ties": "fallback", "notes": []},
           "measurements": [{"m": 1, "n": 4096, "k": 7168, "kernel_us": 1.0, "fallback_us": 2.0}]}
    sweep.write(doc, d / "measured" / "gemv.toml")
    st = plugin.shipped_stamp(name, "measured/gemv.toml")
    assert st == plugin.Stamp.from_dict(SWEPT, where="test") and st.fallback["function"] == "the fallback the sweep measured"
    assert st.fallback["function"] != plugin.OPS["gemv"].fallback  # not the table's: a changed fallback is seen
    assert plugin.shipped_stamp(name, "measured/gemv.toml", op="gemv") is st  # remembered
    hwprofile.reset()
    assert plugin.shipped_stamp(name, "measured/gemv.toml") is not st  # read again after a reset
    assert "hwprofile.plugin._forget_shipped_stamps" in _state.registered()


def test_a_shipped_stamp_is_stale_against_another_fallback(plugin_pkg: tuple[str, pathlib.Path]) -> None:
    """Installed beside a core whose fallback for the op differs from the one the sweep measured, the stamp compares stale."""
    import tomli_w

    from hwprofile import tuning

    name, d = plugin_pkg
    (d / "measured" / "gemv.toml").write_text(tomli_w.dumps({"stamp": {**SWEPT, "fallback": tuning.fallback_identity("gemv")},
                                                             "thresholds": {"gemv.max_n": 4096}}))
    st = plugin.shipped_stamp(name, "measured/gemv.toml")
    now = st.replace(fallback={**st.fallback, "function": "a new fallback"})
    assert "fallback function changed (torch.nn.functional.linear -> a new fallback)" in tuning.compare(st, now, real_gpu=False).stale
    assert not tuning.compare(st, st, real_gpu=True).stale


def test_shipped_stamp_errors_name_the_package_and_the_file_and_the_fix(plugin_pkg: tuple[str, pathlib.Path]) -> None:
    import tomli_w

    name, d = plugin_pkg
    with pytest.raises(PluginError, match=rf"plugin package '{name}' ships no sweep file 'measured/gemv.toml' .*package-data"):
        plugin.shipped_stamp(name, "measured/gemv.toml")
    (d / "measured" / "gemv.toml").write_text(tomli_w.dumps({"thresholds": {"gemv.max_n": 4096}}))
    with pytest.raises(PluginError, match=rf"plugin package '{name}', sweep file 'measured/gemv.toml' \(.*\): no \[stamp\] table"
                       r".*regenerate it with 'hwprofile sweep', and ship its \[stamp\] and \[thresholds\] as this file"):
        plugin.shipped_stamp(name, "measured/gemv.toml")
    (d / "measured" / "gemv.toml").write_text(tomli_w.dumps({"stamp": {"op": "gemv"}, "thresholds": {}}))
    with pytest.raises(PluginError, match=r"sweep file 'measured/gemv.toml' .*\[stamp\] is incomplete or malformed"):
        plugin.shipped_stamp(name, "measured/gemv.toml")
    (d / "measured" / "gemv.toml").write_text(tomli_w.dumps({"stamp": SWEPT, "thresholds": {}}))
    with pytest.raises(PluginError, match=rf"'{name}': sweep file 'measured/gemv.toml' holds the stamp of op 'gemv', not 'fp8_gemv'"):
        plugin.shipped_stamp(name, "measured/gemv.toml", op="fp8_gemv")
    with pytest.raises(PluginError, match=r"package 'no_such_plugin_pkg' is not importable"):
        plugin.shipped_stamp("no_such_plugin_pkg", "measured/gemv.toml")


def _hwprofile_imports(text: str) -> set[str]:
    """``module.name`` for every name a source imports from hwprofile (``hwprofile`` alone for the package)."""
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hwprofile":
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "hwprofile"}
    return out


def test_shipped_plugins_the_example_and_the_scaffold_use_only_the_declared_api() -> None:
    from hwprofile import scaffold

    allowed = {f"hwprofile.{n}" for n in hwprofile.__all__} | {f"hwprofile.plugin.{n}" for n in plugin.__all__}
    files = [*ROOT.glob("plugins/*/src/**/*.py"), *ROOT.glob("examples/*/src/**/*.py")]
    assert len(files) >= 5  # every module: the three plugins' packages, sm90's planning, the example
    sources = {str(f): f.read_text() for f in files}
    sources |= {rel: text for rel, text in scaffold.files("sm89", "8.9").items() if rel.endswith(".py")}
    for where, text in sources.items():
        assert _hwprofile_imports(text) <= allowed, (where, _hwprofile_imports(text) - allowed)
