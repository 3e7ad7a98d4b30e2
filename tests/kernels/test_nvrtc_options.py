"""A kernel spec's NVRTC options are parsed once, into one typed record that the compile, the key and the digests read."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import hwprofile
from hwprofile import _entrypoints, registry
from hwprofile.errors import PluginError
from hwprofile.kernels import KernelSpec, toolchain
from hwprofile.kernels.spec import NvrtcOptions, parse_options

EVERY_FORM = ("-I/a", "-I", "/b", "--include-path=/c", "--include-path", "/d", "-include", "/x/pre.h",
              "--pre-include=/y/other.h", "-DX=1", "-lineinfo")


def test_every_form_of_include_dir_and_forced_header_is_read() -> None:
    o = parse_options(EVERY_FORM)
    assert o.argv == EVERY_FORM  # NVRTC gets them as given, in order
    assert o.include_dirs == ("/a", "/b", "/c", "/d")
    assert o.pre_includes == ("/x/pre.h", "/y/other.h")
    assert o.portable == ("-I<-I 0>", "-I", "<-I 1>", "--include-path=<-I 2>", "--include-path", "<-I 3>",
                          "-include", "<pre-include pre.h>", "--pre-include=<pre-include other.h>", "-DX=1", "-lineinfo")


def test_parsed_once_per_distinct_options() -> None:
    assert parse_options(("-I/a",)) is parse_options(("-I/a",))
    spec = KernelSpec("toy", "toy", "k.cu", (), print, options=("-I/a", "-DY"))
    assert spec.nvrtc_options is parse_options(("-I/a", "-DY")) and isinstance(spec.nvrtc_options, NvrtcOptions)


def test_compile_options_read_the_parsed_fields() -> None:
    o = toolchain.CompileOptions("sm_90a", ("/hw/include", "/cuda/include"), parse_options(EVERY_FORM))
    assert o.flags()[-len(EVERY_FORM):] == list(EVERY_FORM)
    assert o.header_dirs() == ("/hw/include", "/cuda/include", "/a", "/b", "/c", "/d")
    key = o.as_key()["flags"]
    assert key[-len(EVERY_FORM):] == list(parse_options(EVERY_FORM).portable)
    assert not any(p in f for f in key for p in ("/a", "/b", "/x/", "/hw/", "/cuda/"))


@pytest.mark.parametrize("options", ["-DX", (["-I", "/d"],), None, 3])
def test_options_that_are_not_a_tuple_of_strings_are_an_error_naming_them(options: object) -> None:
    spec = KernelSpec("toy", "toy", "k.cu", (), print, options=options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="options must be a tuple of strings|options are strings"):
        spec.nvrtc_options  # noqa: B018


def test_compile_options_refuse_unparsed_strings() -> None:
    with pytest.raises(TypeError, match=r"CompileOptions.extra must be parsed options \(spec.nvrtc_options"):
        toolchain.CompileOptions("sm_90a", (), ("-O3",))  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "flag"), [
    (("-DX", "-I"), "'-I'"), (("--include-path=",), "'--include-path='"), (("--include-path",), "'--include-path'"),
    (("-include",), "'-include'"), (("--pre-include=",), "'--pre-include='"),
])
def test_a_flag_without_its_value_is_an_error_naming_it(options: tuple[str, ...], flag: str) -> None:
    with pytest.raises(ValueError, match=f"NVRTC option {flag} has no value: write ") as e:
        parse_options(options)
    assert ("--include-path=DIR" in str(e.value)) != ("--pre-include=HEADER" in str(e.value))  # a form that is read


def test_a_non_string_option_is_an_error() -> None:
    with pytest.raises(ValueError, match="is a PosixPath: options are strings"):
        parse_options((Path("/a"),))  # type: ignore[arg-type]


def test_a_plugin_kernel_with_a_bad_option_is_named_when_the_profile_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "badopt_mod.py").write_text(textwrap.dedent("""
        from hwprofile import hookimpl
        from hwprofile.kernels import KernelSpec, Launch

        @hookimpl
        def hwprofile_kernels(device, target):
            return [KernelSpec("gemv", "badopt_mod", "k.cu", ("k",), lambda **kw: None, options=("-DX", "-I"))]
    """))
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "badopt_mod", raising=False)
    real = registry.find_entry_points
    ep = _entrypoints.EntryPoint("badopt", "badopt_mod", "hwprofile-badopt", "0.3.1")
    monkeypatch.setattr(registry, "find_entry_points", lambda group: [*real(group), ep])
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    with pytest.raises(PluginError, match=r"plugin badopt \(hwprofile-badopt 0.3.1\): kernel 'gemv' has a bad NVRTC option: "
                                          r"NVRTC option '-I' has no value"):
        hwprofile.profile(0)
    hwprofile.reset()


def test_shipped_specs_keep_their_path_free_key_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sm90 gate's ``-I`` option stays a placeholder: shipped cache entries and rank digests keep their keys."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    spec = hwprofile.profile(0).kernels["moe_gate"]
    assert len(spec.nvrtc_options.include_dirs) == 1 and spec.nvrtc_options.portable == ("-I<-I 0>",)
    hwprofile.reset()
