"""docs/downstream-overrides.md is enough to write a downstream plugin: its blocks, checked and run.

The blocks that name a file (```python title=src/acme_hwprofile/__init__.py) are the whole example
package. The tests check that every block is valid, that the documented ``Setting`` signature is the
real one, that the example's declarations construct, that the profile it resolves and the errors it
raises are what the page says, and finally run the package's own tests (the page's commands) with
``--hwprofile-device=h200`` and ``none`` in a subprocess that sees the package as installed (a
``dist-info`` on its path, so nothing is installed into this environment).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile.plugin import Setting, hookimpl, simulated_device
from hwprofile.profiles import build_profile
from hwprofile.registry import Registry

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "downstream-overrides.md"
MODULE = "src/acme_hwprofile/__init__.py"
TESTS = "tests/test_acme.py"
H200 = simulated_device((9, 0), "NVIDIA H200")


def doc() -> str:
    return DOC.read_text()


def titled_files() -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"```\w+ title=(\S+)\n(.*?)```", doc(), re.S)}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}(?: title=\S+)?\n(.*?)```", doc(), re.S)


def commands() -> list[str]:
    return [ln[2:] for block in blocks("console") for ln in block.splitlines() if ln.startswith("$ ")]


def page_layers(key: str) -> list[tuple[str, str, str]]:
    """(kind, value, source) of each layer the page's ``hwprofile explain KEY --simulate h200`` output shows."""
    m = re.search(rf"\$ hwprofile explain {re.escape(key)} --simulate h200\n(.*?)(?:\n\$|```)", doc(), re.S)
    assert m is not None, key
    rows = re.findall(r"^ {3}(?:->| {2}) (\w+) +(\S+) +(.+?)  \(", m.group(1), re.M)
    return [(kind, value, source) for kind, value, source in rows]


def load_example(tmp_path: Path) -> types.ModuleType:
    """The page's plugin module, imported from a file under ``tmp_path`` (not installed)."""
    path = tmp_path / "acme_hwprofile.py"
    path.write_text(titled_files()[MODULE])
    spec = importlib.util.spec_from_file_location("acme_hwprofile_from_doc", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def registry_with(mod: object) -> Registry:
    """The installed plugins (the repository's own example disabled: it caps the same threshold) and the page's."""
    reg = Registry({"HWPROFILE_DISABLE_PLUGINS": "myengine"}).load_entry_points()
    reg.register(mod, "acme", distribution="acme-hwprofile", version="0.1.0")
    return reg


def test_the_page_is_a_whole_package() -> None:
    files = titled_files()
    assert set(files) == {"pyproject.toml", MODULE, TESTS}
    for block in blocks("python"):
        ast.parse(block)
    for block in blocks("toml"):
        tomllib.loads(block)
    pyproject = tomllib.loads(files["pyproject.toml"])
    major, minor = (int(x) for x in hwprofile.__version__.split(".")[:2])
    assert pyproject["project"]["dependencies"] == [f"hwprofile>={major}.{minor}.0,<{major}.{minor + 1}"]
    assert pyproject["project"]["entry-points"]["hwprofile.plugins"] == {"acme": "acme_hwprofile"}
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["where"] == ["src"]
    assert pyproject["build-system"]["build-backend"] == "setuptools.build_meta"


def test_install_commands_install_by_path_with_the_pytest_plugin() -> None:
    cmds = commands()
    installs = [c for c in cmds if c.startswith("pip install")]
    assert installs == [
        "pip install './hwprofile/core[cu13]' ./hwprofile/plugins/sm90 ./hwprofile/pytest-hwprofile pytest",
        "pip install -e ./acme-hwprofile",
    ]
    assert "python -m pytest --hwprofile-device=h200 tests" in cmds
    assert "pytest-hwprofile" in doc() and "not from\n`hwprofile`" in doc()


def test_documented_setting_signature_is_the_real_one() -> None:
    m = re.search(r"```\n(Setting\(.*?\))\n```", doc())
    assert m is not None
    params = list(inspect.signature(Setting.__init__).parameters.values())[1:]  # without self
    real = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params)
    assert m.group(1) == f"Setting({real})"
    with pytest.raises(TypeError, match="bounds"):
        Setting("acme.x", "int", 1, "doc", bounds=(1, 64))  # type: ignore[call-arg]


def test_example_declarations_construct_with_bounds_and_choices(tmp_path: Path) -> None:
    declared = {s.key: s for s in load_example(tmp_path).hwprofile_declare_settings()}
    chunk, backend = declared["acme.prefill_chunk_tokens"], declared["acme.attention_backend"]
    assert (chunk.type, chunk.default, chunk.minimum, chunk.maximum) == ("int", 2048, 256, 16384)
    assert (backend.type, backend.default, backend.choices) == ("enum", "sdpa", ("sdpa", "flash", "flashinfer"))
    assert chunk.env_var == "HWPROFILE_ACME_PREFILL_CHUNK_TOKENS" and chunk.env_var in doc()
    assert chunk.allowed() == "an integer in [256, 16384]"


def test_example_resolves_as_the_page_says(tmp_path: Path) -> None:
    reg = registry_with(load_example(tmp_path))
    prof = build_profile(H200, reg, {})
    assert prof.get("acme.prefill_chunk_tokens", int) == 4096
    assert prof.get("acme.attention_backend", str) == "flash"
    why = prof.explain("router_gemm.max_tokens")
    assert why.value == 8 and why.winner.source == "acme-hwprofile 0.1.0"
    assert [layer.kind for layer in why.chain] == ["core", "downstream"]  # sm90 leaves the router's M limit to the core
    assert page_layers("router_gemm.max_tokens") == [(layer.kind, str(layer.value), layer.source) for layer in why.chain]
    above = build_profile(simulated_device((10, 0), "NVIDIA B200"), reg, {}).explain("router_gemm.max_tokens")
    assert [(layer.kind, layer.value) for layer in above.chain] == [("core", 16), ("arch", 16), ("downstream", 8)]  # above sm100's
    assert (why.setting.minimum, why.setting.maximum, why.setting.env_var) == (0, 16, "HWPROFILE_ROUTER_GEMM_MAX_TOKENS")
    assert prof.apply_env({})["ACME_ATTENTION_BACKEND"] == "flash"
    assert prof.apply_env({"ACME_ATTENTION_BACKEND": "sdpa"}).get("ACME_ATTENTION_BACKEND") is None  # the user's value stays
    other = build_profile(simulated_device((12, 0)), reg, {})
    assert other.get("acme.prefill_chunk_tokens", int) == 2048 and other.get("router_gemm.max_tokens", int) <= 8
    user = build_profile(H200, reg, {"HWPROFILE_ACME_PREFILL_CHUNK_TOKENS": "1024"})
    assert user.get("acme.prefill_chunk_tokens", int) == 1024


def _error(fn: Any, tmp_path: Path) -> hwprofile.HwprofileError:
    base = load_example(tmp_path)
    mod = types.ModuleType("acme_hwprofile_faulty")
    mod.hwprofile_declare_settings = base.hwprofile_declare_settings  # type: ignore[attr-defined]
    mod.hwprofile_settings = hookimpl(fn)  # type: ignore[attr-defined]
    with pytest.raises(hwprofile.HwprofileError) as e:
        build_profile(H200, registry_with(mod), {})
    return e.value


def test_errors_are_the_ones_the_page_names(tmp_path: Path) -> None:
    text = " ".join(doc().split())
    out_of_bounds = _error(lambda device, resolved: {"acme.prefill_chunk_tokens": 100000}, tmp_path)
    assert isinstance(out_of_bounds, hwprofile.SettingError) and str(out_of_bounds) in text
    undeclared = _error(lambda device, resolved: {"acme.nope": 1}, tmp_path)
    assert isinstance(undeclared, hwprofile.SettingError)
    assert str(undeclared).startswith("plugin acme (acme-hwprofile 0.1.0) sets undeclared setting ")
    raised = _error(lambda device, resolved: resolved["x"], tmp_path)
    assert isinstance(raised, hwprofile.PluginError)
    assert str(raised).startswith("plugin acme (acme-hwprofile 0.1.0) raised in hwprofile_settings: KeyError: ")
    assert isinstance(raised.__cause__, KeyError)

    reg = registry_with(load_example(tmp_path))
    with pytest.raises(hwprofile.SettingError) as user:
        build_profile(H200, reg, {"HWPROFILE_ACME_PREFILL_CHUNK_TOKENS": "100000"})
    assert str(user.value).startswith("HWPROFILE_ACME_PREFILL_CHUNK_TOKENS='100000' is not valid ")

    from hwprofile.device import Detection

    with pytest.raises(hwprofile.DeviceError) as none:
        Detection((), "no NVIDIA driver is usable on this machine").device(0)
    assert str(none.value).endswith("Simulate one with HWPROFILE_DEVICE=<name>, e.g. h200.")
    assert "Simulate one with HWPROFILE_DEVICE=<name>, e.g. h200." in text


def _as_installed(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The page's package written out, and an environment whose path holds it and a dist-info for its entry point."""
    pkg = tmp_path / "acme-hwprofile"
    for name, text in titled_files().items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    info = tmp_path / "site" / "acme_hwprofile-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-hwprofile\nVersion: 0.1.0\n")
    entry_points = tomllib.loads(titled_files()["pyproject.toml"])["project"]["entry-points"]["hwprofile.plugins"]
    (info / "entry_points.txt").write_text("[hwprofile.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_") and k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(pkg / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return pkg, env


def test_the_pages_package_tests_pass_on_a_simulated_h200(tmp_path: Path) -> None:
    pytest.importorskip("pytest_hwprofile")
    pkg, env = _as_installed(tmp_path)
    runs = [c for c in commands() if c.startswith("python -m pytest")]
    assert runs == ["python -m pytest --hwprofile-device=h200 tests", "python -m pytest --hwprofile-device=none tests"]
    # --hwprofile-device=none leaves the real devices: on an sm_90 GPU host the page's sm_90 test runs there too
    real = hwprofile.detect({k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}).devices
    sm90_host = bool(real) and real[0].compute_capability == (9, 0)
    expected = {"h200": "4 passed", "none": "4 passed" if sm90_host else "3 passed, 1 skipped"}
    for cmd in runs:
        args = cmd.split()[3:]
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args], cwd=pkg, env=env, capture_output=True, text=True
        )
        device = args[0].split("=")[1]
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert expected[device] in res.stdout, res.stdout[-2000:]
        if device == "none" and not sm90_host:
            assert re.search(r"test_acme\.py:\d+: needs sm_90; no device", res.stdout), res.stdout[-2000:]
