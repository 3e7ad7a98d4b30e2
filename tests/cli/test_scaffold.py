"""A new architecture is a new package: the guide's steps, run for real (sm_89, L40S).

The scaffold is installed into this test environment with pip and uninstalled at the end, so the
test runs only where no device is simulated for the whole session (the "none" leg of .ci/run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hwprofile import hookimpl, scaffold
from hwprofile.cli import main
from hwprofile.device import DeviceInfo
from hwprofile.errors import HwprofileError, PluginError
from hwprofile.registry import Registry

DOC = Path(__file__).parents[2] / "docs" / "writing-a-plugin.md"


def doc_blocks() -> tuple[dict[str, str], list[str]]:
    text = DOC.read_text()
    files = {m.group(1): m.group(2) for m in re.finditer(r"```\w+ title=(\S+)\n(.*?)```", text, re.S)}
    commands = [ln[2:] for block in re.findall(r"```console\n(.*?)```", text, re.S) for ln in block.splitlines() if ln.startswith("$ ")]
    return files, commands


def test_guide_files_are_the_scaffold() -> None:
    files, _ = doc_blocks()
    generated = scaffold.files("sm89", "8.9")
    assert files == {k: v for k, v in generated.items() if k != "README.md"}


def hw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hwprofile.cli", *args], capture_output=True, text=True, env=env or os.environ.copy())


@pytest.mark.skipif(
    bool(os.environ.get("HWPROFILE_DEVICE")), reason="installs a plugin into the environment: runs in the leg without a simulated device"
)
def test_guide_steps_for_sm89(tmp_path: Path) -> None:
    _, commands = doc_blocks()
    assert commands == [
        "hwprofile new-plugin sm89 --capability 8.9 --dir hwprofile-sm89",
        "pip install ./hwprofile-sm89",
        "hwprofile show --simulate l40s",
        "hwprofile explain sm89.example_flag --simulate l40s",
        "hwprofile compile --arch sm_89",
        "python -m pytest hwprofile-sm89/tests",
        "pip uninstall -y hwprofile-sm89",
    ]
    pkg = tmp_path / "hwprofile-sm89"
    assert main(["new-plugin", "sm89", "--capability", "8.9", "--dir", str(pkg)]) == 0
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-build-isolation", str(pkg)], check=True, capture_output=True)
    try:
        show = json.loads(hw("show", "--simulate", "l40s", "--json").stdout)
        assert (
            show["plugin"]["name"] == "sm89"
            and show["plugin"]["distribution"] == "hwprofile-sm89"
            and show["plugin"]["nvrtc_arch"] == "sm_89"
        )
        flag = json.loads(hw("explain", "sm89.example_flag", "--simulate", "l40s", "--json").stdout)
        assert (
            flag["value"] is True
            and flag["source"] == "hwprofile-sm89 0.1.0"
            and flag["chain"][-1]["reason"] == "why this architecture wants the flag on"
        )
        if sys.modules.get("cuda.bindings.nvrtc") or _has_nvrtc():
            rows = json.loads(hw("compile", "--arch", "sm_89", "--json").stdout)
            assert [(r["op"], r["target"], r["errors"]) for r in rows] == [("sm89_scale", "sm_89", [])] and rows[0]["cubin_bytes"] > 0
        own = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg / "tests")], capture_output=True, text=True
        )
        assert own.returncode == 0, own.stdout[-2000:]
    finally:
        subprocess.run([*pip, "uninstall", "-y", "-q", "hwprofile-sm89"], check=True, capture_output=True)
    show = json.loads(hw("show", "--simulate", "l40s", "--json").stdout)
    assert show["plugin"]["name"] is None and "no installed architecture plugin" in show["plugin"]["reason"]


def _has_nvrtc() -> bool:
    try:
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["Sm-89", "--capability", "8.9"], "plugin name 'Sm-89' is invalid"),
        (["sm89", "--capability", "89"], "write major.minor"),
        (["sm89", "--capability", "8.9", "--target", "compute_89"], "--target 'compute_89' is invalid"),
    ],
)
def test_scaffold_input_errors(tmp_path: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-plugin", *args, "--dir", str(tmp_path / "x")]) == 2
    assert needle in capsys.readouterr().err


def test_scaffold_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(HwprofileError, match="not empty"):
        scaffold.write(tmp_path, "sm89", "8.9")


def _load_scaffold_module(tmp_path: Path, name: str, capability: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    import importlib

    scaffold.write(tmp_path / name, name, capability)
    monkeypatch.syspath_prepend(str(tmp_path / name / "src"))
    return importlib.import_module(f"hwprofile_{name}")


def test_capability_already_claimed_names_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _load_scaffold_module(tmp_path, "myhopper", "9.0", monkeypatch)
    reg = Registry({}).load_entry_points()
    reg.register(mod, "myhopper", distribution="hwprofile-myhopper", version="0.1.0")
    with pytest.raises(PluginError) as e:
        reg.select(DeviceInfo(0, "NVIDIA H200", (9, 0), simulated=True))
    msg = str(e.value)
    assert "hwprofile-sm90" in msg and "hwprofile-myhopper 0.1.0" in msg and "HWPROFILE_PLUGIN" in msg


def test_missing_kernel_file_names_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.profiles import build_profile

    mod = _load_scaffold_module(tmp_path, "sm86x", "8.6", monkeypatch)
    (tmp_path / "sm86x" / "src" / "hwprofile_sm86x" / "kernels" / "scale.cu").unlink()
    reg = Registry({})
    reg.register(mod, "sm86x", distribution="hwprofile-sm86x", version="0.1.0")
    with pytest.raises(PluginError, match=r"plugin sm86x: kernel 'sm86x_scale' source 'kernels/scale.cu' is missing .*package-data"):
        build_profile(DeviceInfo(0, "x", (8, 6), simulated=True), reg, {})


def test_misspelt_hook_argument_in_a_plugin_module() -> None:
    bad = types.ModuleType("hwprofile_typo")

    @hookimpl
    def hwprofile_kernels(devise, target):  # type: ignore[no-untyped-def]
        return []

    bad.hwprofile_kernels = hwprofile_kernels  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match="(?s)typo.*devise.*hookspecs"):
        Registry({}).register(bad, "typo", distribution="hwprofile-typo", version="0.1.0")
