"""A new architecture is a new package: the guide's steps, run for real (sm_89, L40S).

The scaffold is installed with pip into a directory of its own (``pip install --target``), and the guide's
commands run in fresh processes that have it on ``PYTHONPATH``: the environment the tests run in is never
changed, so these tests run beside any other.
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
    return subprocess.run([sys.executable, "-m", "hwprofile.cli", *args], capture_output=True, text=True, env=env or _clean_env())


def _clean_env(site: Path | None = None) -> dict[str, str]:
    """This process's environment without a simulated device, plus ``site`` (a ``pip install --target``) on the path."""
    env = {k: v for k, v in os.environ.items() if k != "HWPROFILE_DEVICE"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def _install(pkg: Path, site: Path) -> None:
    """``pip install PKG`` as the guide says, into ``site`` only: the test environment stays as it was."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(pkg)],
                   check=True, capture_output=True)


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
    pkg, site = tmp_path / "hwprofile-sm89", tmp_path / "site"
    assert main(["new-plugin", "sm89", "--capability", "8.9", "--dir", str(pkg)]) == 0
    _install(pkg, site)
    env = _clean_env(site)
    show = json.loads(hw("show", "--simulate", "l40s", "--json", env=env).stdout)
    assert (
        show["plugin"]["name"] == "sm89"
        and show["plugin"]["distribution"] == "hwprofile-sm89"
        and show["plugin"]["nvrtc_arch"] == "sm_89"
    )
    flag = json.loads(hw("explain", "sm89.example_flag", "--simulate", "l40s", "--json", env=env).stdout)
    assert (
        flag["value"] is True
        and flag["source"] == "hwprofile-sm89 0.1.0"
        and flag["chain"][-1]["reason"] == "why this architecture wants the flag on"
    )
    if sys.modules.get("cuda.bindings.nvrtc") or _has_nvrtc():
        rows = json.loads(hw("compile", "--arch", "sm_89", "--json", env={**env, "HWPROFILE_CACHE_DIR": str(tmp_path / "cache")}).stdout)
        assert [(r["op"], r["target"], r["errors"]) for r in rows] == [("sm89_scale", "sm_89", [])] and rows[0]["cubin_bytes"] > 0
    own = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg / "tests")], capture_output=True, text=True, env=env
    )
    assert own.returncode == 0, own.stdout[-2000:]
    # the guide's last step (pip uninstall) is not run: the plugin lived in its own directory only, and this
    # environment, which the other tests share, never had it
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
    """new-plugin refuses a claimed capability (below); a package written by hand still meets the registry's error."""
    monkeypatch.setattr(scaffold, "claimed_by", lambda cc: None)
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


# --- names and targets that must be refused (issue 25) ---------------------------------------------


@pytest.mark.parametrize(
    ("capability", "target"),
    [
        ("8.9", "sm_90a"), ("8.9", "sm_90"), ("9.0", "sm_89"), ("10.3", "sm_100a"), ("10.3", "sm_100f"), ("12.1", "sm_120a"),
        ("8.0", "sm_89"),
    ],
)
def test_target_must_be_the_capabilitys(tmp_path: Path, capability: str, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--capability 8.9 --target sm_90a`` was accepted: a plugin whose kernels cannot run on the devices it claims."""
    own = "sm_" + capability.replace(".", "")
    with pytest.raises(HwprofileError) as e:
        scaffold.files("mygpu", capability, target)
    msg = str(e.value)
    assert f"--target {target} does not match --capability {capability}" in msg and f"{own}, {own}a or {own}f" in msg
    assert main(["new-plugin", "mygpu", "--capability", capability, "--target", target, "--dir", str(tmp_path / "x")]) == 2
    assert "does not match --capability" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.parametrize(("capability", "target"), [("8.9", None), ("8.9", "sm_89"), ("8.9", "sm_89a"), ("9.0", "sm_90a"),
                                                    ("10.3", "sm_103a"), ("10.0", "sm_100f"), ("12.1", "sm_121a")])
def test_targets_of_the_capability_are_accepted(capability: str, target: str | None) -> None:
    files = scaffold.files("mygpu", capability, target)
    assert f'"{target or "sm_" + capability.replace(".", "")}"' in files["src/hwprofile_mygpu/__init__.py"]


def test_installed_plugin_names_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``new-plugin sm90`` scaffolded a package named after the installed hwprofile-sm90, which installing it would replace."""
    installed = [p for p in Registry({}).load_entry_points().plugins.values() if p.distribution]
    if not installed:
        pytest.skip("no plugin installed")
    for p in installed:
        d = tmp_path / p.name
        with pytest.raises(HwprofileError) as e:
            scaffold.write(d, p.name, "8.9")
        msg = str(e.value)
        assert msg.startswith(f"plugin name {p.name!r} is taken: ") and "Choose a name of your own" in msg, msg
        assert str(p.distribution) in msg and not d.exists()
        assert main(["new-plugin", p.name, "--capability", "8.9", "--dir", str(d)]) == 2
        assert f"plugin name {p.name!r} is taken" in capsys.readouterr().err and not d.exists()


def test_installed_distribution_name_is_refused_by_its_version() -> None:
    from importlib.metadata import version

    if scaffold.name_taken("sm90") is None:
        pytest.fail("sm90 is shipped: taken whether installed or not")
    try:
        v = version("hwprofile-sm90")
    except Exception:  # noqa: BLE001 - not installed: the shipped-name rule alone
        assert "a plugin hwprofile ships" in (scaffold.name_taken("sm90") or "")
    else:
        assert scaffold.name_taken("sm90") == f"hwprofile-sm90 {v} is installed here"


@pytest.mark.parametrize("name", ["sm90", "sm100", "sm120"])  # scaffold.SHIPPED_PLUGINS, checked below
def test_shipped_plugin_names_are_refused_even_when_not_installed(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.metadata
    import importlib.util

    from hwprofile import _entrypoints

    def missing(dist: str) -> object:
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    monkeypatch.setattr(_entrypoints, "find_entry_points", lambda group: [])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    assert scaffold.name_taken(name) == f"hwprofile-{name} is a plugin hwprofile ships (plugins/{name} of the hwprofile project)"
    with pytest.raises(HwprofileError, match="is taken"):
        scaffold.write(tmp_path / "p", name, "9.0")
    assert scaffold.name_taken("mysm90") is None


def test_shipped_plugin_names_are_the_repositorys_plugins() -> None:
    plugins = Path(__file__).parents[2] / "plugins"
    assert sorted(scaffold.SHIPPED_PLUGINS) == sorted(p.name for p in plugins.iterdir() if (p / "pyproject.toml").is_file())


def test_a_registered_plugin_name_and_an_importable_module_are_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A downstream plugin's entry-point name (two distributions may not register one name), or a module the package would shadow."""
    from hwprofile import _entrypoints

    ep = _entrypoints.EntryPoint("engine9", "engine9_mod", "engine9-hwprofile", "1.2")
    real = _entrypoints.find_entry_points
    monkeypatch.setattr(_entrypoints, "find_entry_points", lambda group: [*real(group), ep])
    assert scaffold.name_taken("engine9") == "the installed engine9-hwprofile 1.2 registers a plugin named 'engine9'"
    (tmp_path / "hwprofile_mine7.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert (scaffold.name_taken("mine7") or "").startswith("a module hwprofile_mine7 is importable here")
    assert scaffold.name_taken("free_name_42") is None


# --- a plugin on the shared kernel family (issue 35: what sm100 and sm120 share, in hwprofile.plugin helpers) -------

ROOT = Path(__file__).parents[2]
FAMILY_HELPERS = ("family_kernels(", "unmeasured_settings(", "arch_env_defaults(")


def _code_lines(text: str) -> int:
    return sum(1 for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("#", '"""')))


def test_a_family_plugin_is_short_and_built_on_the_shared_helpers() -> None:
    """The scaffold's family plugin and sm100 / sm120 state only what differs (name, targets, tuning, reasons):
    kernels, settings and env defaults are one helper call each, and the tests subclass pytest_hwprofile.family."""
    generated = scaffold.files("sm110", "11.0", "sm_110a", family=True)
    module = generated["src/hwprofile_sm110/__init__.py"]
    assert all(h in module for h in FAMILY_HELPERS) and "kernel_specs(" not in module
    assert _code_lines(module) <= 50, _code_lines(module)
    assert "FamilyPlanChecks" in generated["tests/test_plugin.py"] and "FamilyGPUChecks" in generated["tests/test_plugin.py"]
    for name in ("sm100", "sm120"):
        src = (ROOT / "plugins" / name / "src" / f"hwprofile_{name}" / "__init__.py").read_text()
        assert all(h in src for h in FAMILY_HELPERS) and "gate_kernel_spec(" not in src and "EnvDefault(" not in src, name
        assert _code_lines(src) <= 50, (name, _code_lines(src))
        tests = "".join(p.read_text() for p in (ROOT / "plugins" / name / "tests").glob("*.py"))
        assert "(FamilyPlanChecks)" in tests and "(FamilyGPUChecks)" in tests, name


def test_a_family_plugin_needs_clusters() -> None:
    with pytest.raises(HwprofileError, match=r"--family needs compute capability 9\.0 or later"):
        scaffold.files("myl40s", "8.9", family=True)


def test_a_family_scaffold_resolves_with_every_op_and_the_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from hwprofile.plugin import PREBUILT_SHAPES, compile_kernel
    from hwprofile.profiles import build_profile

    scaffold.write(tmp_path / "sm110", "sm110", "11.0", "sm_110a", family=True)
    monkeypatch.syspath_prepend(str(tmp_path / "sm110" / "src"))
    monkeypatch.setitem(sys.modules, "hwprofile_sm110", None)  # recorded, so the import below is forgotten after the test
    del sys.modules["hwprofile_sm110"]
    mod = importlib.import_module("hwprofile_sm110")
    reg = Registry({})
    reg.register(mod, "sm110", distribution="hwprofile-sm110", version="0.1.0")
    prof = build_profile(DeviceInfo(0, "x", (11, 0), simulated=True), reg, {})
    assert prof.plugin is not None and prof.plugin.name == "sm110" and prof.target == "sm_110a"
    assert set(prof.kernels) == {*PREBUILT_SHAPES, "moe_gate"}
    assert all(i.startswith("hwp_sm110_") for spec in prof.kernels.values() for i in spec.instances)
    assert prof.env_defaults["TORCH_CUDA_ARCH_LIST"].value == "11.0a"
    assert "not measured on SM110" in prof.explain("gemv.model").winner.reason
    if _has_nvrtc():
        assert compile_kernel(prof.kernels["gemv"], prof.target).cubin[:4] == b"\x7fELF"


def test_a_family_scaffold_passes_its_own_tests_installed(tmp_path: Path) -> None:
    pkg, site = tmp_path / "hwprofile-sm110", tmp_path / "site"
    assert main(["new-plugin", "sm110", "--capability", "11.0", "--target", "sm_110a", "--family", "--dir", str(pkg)]) == 0
    _install(pkg, site)
    env = {**_clean_env(site), "HWPROFILE_CACHE_DIR": str(tmp_path / "cache")}
    own = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(pkg / "tests")],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert own.returncode == 0, own.stdout[-3000:]
    # the plan checks (one of two devices of a capability skips: it has one) and the compile; the GPU checks skip here
    assert re.search(r"\b4 passed, 18 skipped\b", own.stdout), own.stdout[-2000:]


# --- capabilities a plugin can be built for, and first steps that work where they are printed (issue 40) ----------


@pytest.mark.parametrize("capability", ["0.0", "6.1", "7.0", "9.9", "10.9"])
def test_a_capability_no_gpu_has_is_refused(capability: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if capability in ("9.9", "10.9") and not _has_nvrtc():
        pytest.skip("which capabilities exist is NVRTC's list: no NVRTC here")
    assert main(["new-plugin", "mygpu", "--capability", capability, "--dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"--capability {capability} is no GPU" in err and "nvidia-smi" in err and not (tmp_path / "x").exists()


def test_a_capability_another_plugin_claims_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    owner = scaffold.claimed_by((9, 0))
    if owner is None:
        pytest.skip("hwprofile-sm90 is not installed here")
    assert main(["new-plugin", "myhopper9", "--capability", "9.0", "--dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "compute capability 9.0 is already claimed by the installed plugin sm90 (" in err and "hwprofile-sm90" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("family", [False, True])
def test_the_next_step_installs_what_the_tests_need_never_by_bare_name(family: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's venv has neither pytest nor pytest-hwprofile: the printed step installs them, pytest-hwprofile from a path."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("pytest", "pytest_hwprofile") else real(name, *a))
    line = scaffold.hint(Path("hwprofile-sm110"), "sm_110a", family=family)
    assert line.startswith("next: pip install 'pytest>=8'")
    assert "python -m pytest ./hwprofile-sm110/tests" in line
    words = line.replace("&&", " ").split()
    assert "pytest-hwprofile" not in words and "pytest_hwprofile" not in words  # never by bare name
    if family:
        assert "pytest-hwprofile" in line and ("/pytest-hwprofile" in line or "git+" in line)


def test_no_generated_file_installs_pytest_hwprofile_by_name() -> None:
    for family in (False, True):
        for path, text in scaffold.files("sm110", "11.0", "sm_110a", family=family).items():
            assert "'.[test]'" not in text and "pytest-hwprofile>=" not in text, path
            assert "pip install pytest-hwprofile" not in text.replace("never `pip install pytest-hwprofile`", ""), path
