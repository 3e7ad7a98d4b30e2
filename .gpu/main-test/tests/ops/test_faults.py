"""Cache and toolchain faults through the op dispatch (CPU): one documented warning and the fallback,
or, with strict mode, the error naming the cause. Nothing reaches the engine as a raw exception.

``ops._kernel.launch`` is the op's kernel branch; the launch-argument check needs CUDA tensors, so it
is bypassed here: every fault below happens in ``hwprofile.kernels.load`` before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.bindings.nvrtc")

import hwprofile  # noqa: E402
from hwprofile import ops  # noqa: E402
from hwprofile.errors import KernelError, ToolchainError  # noqa: E402
from hwprofile.kernels import cache as kcache  # noqa: E402
from hwprofile.kernels import toolchain  # noqa: E402


def _fault(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Set up one fault; return a phrase the warning must contain."""
    if kind == "cache_dir_is_a_file":
        f = tmp_path / "afile"
        f.write_text("")
        monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(f))
        return "is not a directory"
    if kind == "cache_dir_is_a_symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        (tmp_path / "link").symlink_to(tmp_path / "real")
        monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(tmp_path / "link"))
        return "symbolic link"
    if kind == "cache_switch_invalid":
        monkeypatch.setenv("HWPROFILE_CACHE", "disabled")  # after the profile was built: only the kernel pipeline sees it
        return "HWPROFILE_CACHE='disabled' is not valid"
    if kind == "nvrtc_missing":

        def gone() -> None:
            raise ToolchainError("cuda-python's NVRTC bindings are not importable (simulated)")

        monkeypatch.setattr(toolchain, "_nvrtc", gone)
        monkeypatch.setattr(toolchain, "nvrtc_version", lambda: (13, 0))
        return "NVRTC bindings are not importable"
    assert kind == "cache_raises"

    def broken(*a: object, **k: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(kcache, "read", broken)
    return "Input/output error"


FAULTS = ["cache_dir_is_a_file", "cache_dir_is_a_symlink", "cache_switch_invalid", "nvrtc_missing", "cache_raises"]


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ops._dispatch._Table:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(tmp_path / "cache"))
    hwprofile.reset()
    t = ops._dispatch._Table(hwprofile.profile(0))
    return t


def _call(t: ops._dispatch._Table) -> bool:
    x, w, out = (
        torch.zeros(1, 512, dtype=torch.bfloat16),
        torch.zeros(64, 512, dtype=torch.bfloat16),
        torch.empty(1, 64, dtype=torch.bfloat16),
    )
    return ops._kernel.launch(t, "gemv", out, x, w, None, 1, 64, 512, 0)


@pytest.mark.parametrize("kind", FAULTS)
def test_fault_is_the_documented_warning_and_the_fallback(
    table: ops._dispatch._Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    cause = _fault(kind, tmp_path, monkeypatch)
    with pytest.warns(RuntimeWarning, match="gemv kernel unavailable, using the torch fallback") as w:
        assert _call(table) is False
    assert cause in str(w[0].message)


@pytest.mark.parametrize("kind", FAULTS)
def test_fault_in_strict_mode_raises_a_kernel_error_naming_the_cause(
    table: ops._dispatch._Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    cause = _fault(kind, tmp_path, monkeypatch)
    table.strict = True
    with pytest.raises(KernelError, match=cause.replace("(", r"\(").replace(")", r"\)")):
        _call(table)


# --- the same faults through the public ops (needs ops' CPU seam: CPU tensors count as device 0) ---


@pytest.fixture
def public(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if not hasattr(ops._dispatch, "_cpu_index") or not hasattr(ops, "reset_dispatch"):
        pytest.skip("needs the ops CPU seam (ops._dispatch._cpu_index)")
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(tmp_path / "cache"))
    hwprofile.reset()
    ops.reset_dispatch()
    hwprofile.profile(0)  # resolved before the fault: a bad HWPROFILE_CACHE then only reaches the kernel pipeline
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    yield
    ops.reset_dispatch()


@pytest.mark.parametrize("kind", FAULTS)
def test_public_op_survives_every_fault_with_one_warning(public: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    x, w = torch.randn(1, 1024).to(torch.bfloat16), torch.randn(256, 1024).to(torch.bfloat16)
    cause = _fault(kind, tmp_path, monkeypatch)
    with pytest.warns(RuntimeWarning, match="gemv kernel unavailable, using the torch fallback") as w1:
        y = ops.gemv(x, w)
    assert cause in str(w1[0].message)  # the warning proves the call took the kernel path and met the fault
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the next call takes the fallback silently
        ops.gemv(x, w)


@pytest.mark.parametrize("kind", FAULTS)
def test_public_op_in_strict_mode_raises_the_cause(public: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    hwprofile.profile(0)
    cause = _fault(kind, tmp_path, monkeypatch)
    x, w = torch.randn(1, 1024).to(torch.bfloat16), torch.randn(256, 1024).to(torch.bfloat16)
    with pytest.raises(KernelError) as e:
        ops.gemv(x, w)
    assert cause in str(e.value)
