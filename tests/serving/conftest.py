"""Shared seams of the serving tests: a simulated H200 whose CPU tensors route as device 0, and a kernel
pipeline that runs for real except NVRTC (a fake that counts its calls), the driver and the launch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.kernels import _pipeline, toolchain
from hwprofile.kernels import launch as klaunch


@dataclass
class Seam:
    """What the fakes saw: NVRTC compiles (name expressions), module loads, launches; the fake capture flag."""

    cache: Path
    compiles: list[tuple[str, ...]] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    launches: list[str] = field(default_factory=list)
    capturing: bool = False


def fake_nvrtc(seam: Seam) -> Any:
    def compile_(source: str, name: str, options: Any, exprs: Any, *, what: str) -> tuple[bytes, dict[str, str], str]:
        seam.compiles.append(tuple(exprs))
        return b"\x7fELF fake cubin of " + ",".join(exprs).encode(), {e: f"_Z{len(e)}lowered" for e in exprs}, ""

    return compile_


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_downstream: None) -> Iterator[Seam]:
    pytest.importorskip("torch")
    s = Seam(tmp_path / "cache")
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(s.cache))
    monkeypatch.delenv("HWPROFILE_NO_COMPILE", raising=False)
    hwprofile.reset()
    ops.reset_dispatch()
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    monkeypatch.setattr(toolchain, "nvrtc_compile", fake_nvrtc(s))
    monkeypatch.setattr(_pipeline, "driver_cuda_version", lambda: None)

    def load_function(key: str, cubin: bytes, lowered: str, device_index: int, *, what: str) -> object:
        s.loads.append(lowered)
        return ("function", lowered)

    monkeypatch.setattr(klaunch, "load_function", load_function)
    monkeypatch.setattr(klaunch.LoadedKernel, "launch", lambda self, plan, stream, args: s.launches.append(plan.name_expression))
    monkeypatch.setattr(ops._kernel, "raw_stream", lambda index: 0)
    monkeypatch.setattr(ops._kernel, "_capturing", lambda index: s.capturing)
    monkeypatch.setattr(ops._kernel, "fallback_ready", set())
    monkeypatch.setattr(_pipeline, "_forbidden", None)
    yield s
    ops.reset_dispatch()
    hwprofile.reset()
