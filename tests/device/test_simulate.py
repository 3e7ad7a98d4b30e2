"""Any capability can be simulated (sm_XY, X.Y), plugins contribute catalog entries, the pytest plugin
validates its device option once and its fixture skips, and CUDA headers follow NVRTC's major."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import hwprofile
from hwprofile import catalog, hookimpl
from hwprofile.device import DeviceInfo, simulated_detection
from hwprofile.errors import DeviceError, PluginError
from hwprofile.kernels import headers
from hwprofile.plugin import CatalogEntry
from hwprofile.registry import Registry

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("name", "cc"), [("sm_110", (11, 0)), ("SM110", (11, 0)), ("11.0", (11, 0)), ("sm_87", (8, 7)), ("sm_121a", (12, 1)), ("7.5", (7, 5))]
)
def test_generic_capability_names(name: str, cc: tuple[int, int]) -> None:
    e = catalog.lookup(name)
    assert e.compute_capability == cc and e.name == f"Simulated sm_{cc[0]}{cc[1]}"
    d = simulated_detection(name).devices[0]
    assert d.simulated and d.compute_capability == cc and d.attributes().sm_count == e.sm_count


def test_generic_borrows_resources_of_same_or_lower_capability() -> None:
    assert catalog.generic((12, 1)).sm_count == catalog.CATALOG["dgx-spark"].sm_count  # same capability exists
    assert catalog.generic((8, 7)).compute_capability == (8, 7)
    assert catalog.generic((8, 7)).max_shared_memory_per_block_optin == catalog.CATALOG["a100"].max_shared_memory_per_block_optin
    assert catalog.generic((7, 5)).sm_count == min(catalog.CATALOG.values(), key=lambda e: e.compute_capability).sm_count


def test_generic_device_selects_the_plugin_that_serves_it() -> None:
    env = {"HWPROFILE_DEVICE": "sm_103"}
    prof = hwprofile.profiles.build_profile(hwprofile.detect(env).devices[0], Registry(env).load_entry_points(), env)
    assert prof.plugin is not None and prof.plugin.name == "sm100" and prof.target == "sm_103a"


class _Thor:
    ENTRY = CatalogEntry("NVIDIA Jetson Thor", (11, 0), 128 << 30, 20, 32 << 20, 227 * 1024, 256, 1575, 4266)

    @hookimpl
    def hwprofile_catalog(self) -> dict[str, CatalogEntry]:
        return {"jetson-thor": self.ENTRY}


def _with_plugin(monkeypatch: pytest.MonkeyPatch, *plugins: tuple[str, object]) -> Registry:
    reg = Registry({})
    for name, obj in plugins:
        reg.register(obj, name, distribution=f"{name}-dist", version="1.0")
    monkeypatch.setattr(hwprofile.profiles, "_registry", reg)
    return reg


def test_plugin_contributes_a_catalog_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _with_plugin(monkeypatch, ("thor", _Thor()))
    found = catalog.lookup("jetson-thor", reg.catalog_entries)
    assert found == _Thor.ENTRY and catalog.lookup("Jetson_Thor", reg.catalog_entries) == _Thor.ENTRY
    d = simulated_detection("jetson-thor,h200", reg.catalog_entries).devices
    assert d[0].name == "NVIDIA Jetson Thor" and d[0].attributes().sm_count == 20 and d[1].name == "NVIDIA H200"
    # hwprofile.detect passes the process registry's entries; the simulated device keeps its attributes after a reset
    d0 = hwprofile.detect({"HWPROFILE_DEVICE": "jetson-thor"}).devices[0]
    assert d0.name == "NVIDIA Jetson Thor"
    hwprofile.reset()
    assert d0.attributes().sm_count == 20


def test_first_profile_of_a_device_only_a_plugin_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlapped first profile() passes the registry's catalog entries to detection."""
    reg = Registry({})
    reg.register(_Thor(), "thor", distribution="thor-dist", version="1.0")
    monkeypatch.setenv("HWPROFILE_DEVICE", "jetson-thor")
    hwprofile.reset()
    monkeypatch.setattr(hwprofile.profiles, "registry", lambda: reg)
    prof = hwprofile.profile(0)
    assert prof.device.name == "NVIDIA Jetson Thor" and prof.device.attributes().sm_count == 20 and prof.plugin is None
    hwprofile.reset()


def test_detection_without_the_plugin_catalog_knows_only_builtin_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """hwprofile.device sits below the registry: it sees a plugin's entries only when the caller passes them."""
    _with_plugin(monkeypatch, ("thor", _Thor()))
    with pytest.raises(DeviceError, match="unknown simulated device 'jetson-thor'"):
        simulated_detection("jetson-thor")


def test_builtin_and_generic_names_need_no_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_plugins() -> dict[str, CatalogEntry]:
        pytest.fail("plugins must not load for a built-in or generic name")

    catalog.lookup("h200", no_plugins)
    catalog.lookup("sm_110", no_plugins)
    monkeypatch.setattr(hwprofile.profiles, "registry", no_plugins)
    hwprofile.reset()
    assert len(hwprofile.detect({"HWPROFILE_DEVICE": "h200,sm_110"}).devices) == 2  # the public detect asks the registry lazily


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ({"h200": _Thor.ENTRY}, "built into hwprofile"),
        ({"sm_110": _Thor.ENTRY}, "generic and built in"),
        ({"Bad Name!": _Thor.ENTRY}, "is invalid"),
        ({"thor2": ("NVIDIA Thor", (11, 0))}, "must be a hwprofile.plugin.CatalogEntry"),
        ([("thor", _Thor.ENTRY)], "must return a dict"),
    ],
)
def test_bad_catalog_entries_name_the_plugin(monkeypatch: pytest.MonkeyPatch, entries: object, needle: str) -> None:
    class Bad:
        @hookimpl
        def hwprofile_catalog(self) -> object:
            return entries

    reg = _with_plugin(monkeypatch, ("bad", Bad()))
    with pytest.raises(PluginError, match="bad-dist 1.0") as e:
        catalog.lookup("anything", reg.catalog_entries)
    assert needle in str(e.value)


def test_same_entry_from_two_plugins_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _with_plugin(monkeypatch, ("thor", _Thor()), ("thor_b", _Thor()))
    with pytest.raises(PluginError, match=r"contributed twice: by thor \(thor-dist 1.0\) and by thor_b \(thor_b-dist 1.0\)"):
        catalog.lookup("jetson-thor", reg.catalog_entries)


def test_unknown_name_lists_builtin_and_plugin_names(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _with_plugin(monkeypatch, ("thor", _Thor()))
    with pytest.raises(DeviceError, match=r"known devices: .*jetson-thor.*sm_XY or X\.Y"):
        catalog.lookup("h300", reg.catalog_entries)


@pytest.mark.hwprofile_per_device  # lists the session's visible devices
def test_devices_command_shows_plugin_entries(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hwprofile.cli import main

    _with_plugin(monkeypatch, ("thor", _Thor()))
    assert main(["devices"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("jetson-thor"))
    assert "NVIDIA Jetson Thor" in row and "11.0" in row and row.rstrip().endswith("plugin")


def test_hookspec_documents_when_and_errors() -> None:
    from hwprofile import hookspecs

    doc = hookspecs.hwprofile_catalog.__doc__ or ""
    assert "When it is called" in doc and "Errors" in doc and ":returns:" in doc


# --- the pytest plugin --------------------------------------------------------------------------------


def test_misspelt_device_option_is_one_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    pytester.makepyfile("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    res = pytester.runpytest_subprocess("--hwprofile-device=h2000")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in res.stderr.lines if "h2000" in ln]
    assert len(errors) == 1 and "--hwprofile-device=h2000: unknown simulated device" in errors[0]


def test_generic_device_option_and_marker(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    pytester.makepyfile(
        "import pytest, hwprofile\n\n"
        "@pytest.mark.hwprofile_arch('sm_110')\n"
        "def test_thor():\n    assert hwprofile.detect().devices[0].compute_capability == (11, 0)\n"
    )
    res = pytester.runpytest_subprocess("--hwprofile-device=sm_110")
    res.assert_outcomes(passed=1)


def test_profile_fixture_skips_without_a_device(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    pytester.makepyfile("def test_p(hwprofile_profile):\n    assert hwprofile_profile.fingerprint\n")
    res = pytester.runpytest_subprocess("-rs", "--hwprofile-device=none")
    if hwprofile.detect({k: v for k, v in os.environ.items() if k != "HWPROFILE_DEVICE"}).devices:
        res.assert_outcomes(passed=1)  # a real GPU here
    else:
        res.assert_outcomes(skipped=1)
        res.stdout.fnmatch_lines(["*nothing to profile: no device*--hwprofile-device=NAME*"])
    res = pytester.runpytest_subprocess("--hwprofile-device=h200")
    res.assert_outcomes(passed=1)


def test_pytest_plugin_module_is_top_level_and_outside_hwprofile() -> None:
    import hwprofile
    import pytest_hwprofile

    core = Path(hwprofile.__file__).resolve().parent
    assert pytest_hwprofile.__name__ == "pytest_hwprofile" and core not in Path(pytest_hwprofile.__file__).resolve().parents
    assert "hwprofile.testing" not in sys.modules


# --- CUDA headers of NVRTC's major ----------------------------------------------------------------------


def _headers(root: Path, name: str, version: int) -> str:
    d = root / name
    d.mkdir(parents=True)
    (d / "cuda_runtime_api.h").write_text(f"/* x */\n#define CUDART_VERSION  {version}\n")
    return str(d)


def test_header_dir_follows_nvrtc_major(tmp_path: Path) -> None:
    cu13 = _headers(tmp_path, "cu13/include", 13050)
    cu12 = _headers(tmp_path, "cuda_runtime/include", 12090)
    assert headers.cuda_major(cu13) == 13 and headers.cuda_major(cu12) == 12
    assert headers.choose(12, [cu13, cu12]) == (cu12, None)  # pathfinder's CUDA 13 first: skipped for NVRTC 12
    assert headers.choose(13, [cu13, cu12]) == (cu13, None)
    d, problem = headers.choose(12, [cu13])
    assert d == cu13 and problem is not None and "NVRTC is CUDA 12" in problem and "[cu12]" in problem  # hwprofile._install
    assert headers.choose(12, [])[0] is None


def test_header_candidates_find_both_wheel_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    cu13 = _headers(site, "nvidia/cu13/include", 13000)
    cu12 = _headers(site, "nvidia/cuda_runtime/include", 12090)
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert headers.candidates(cu13) == [cu13, cu12]
    assert headers.choose(12, headers.candidates(cu13))[0] == cu12


def test_jit_uses_the_header_dir_of_nvrtcs_major(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.kernels import _pipeline as jit
    from hwprofile.kernels import toolchain

    cu13 = _headers(tmp_path, "cu13/include", 13000)
    cu12 = _headers(tmp_path, "cuda_runtime/include", 12090)
    monkeypatch.setattr(toolchain, "nvrtc_version", lambda: (12, 9))  # jit's header functions are toolchain's
    monkeypatch.setattr(headers, "candidates", lambda found: [cu13, cu12])
    jit.cuda_headers.cache_clear()
    jit.include_dirs.cache_clear()
    try:
        assert jit.include_dirs()[-1] == cu12
        jit.check_toolchain()
        monkeypatch.setattr(headers, "candidates", lambda found: [cu13])
        jit.cuda_headers.cache_clear()
        with pytest.raises(hwprofile.errors.ToolchainError, match="NVRTC is CUDA 12"):
            jit.check_toolchain()
    finally:
        jit.cuda_headers.cache_clear()
        jit.include_dirs.cache_clear()


def test_simulated_device_info_flag() -> None:
    assert DeviceInfo(0, "x", (9, 0)).simulated is False and simulated_detection("h200").simulated
