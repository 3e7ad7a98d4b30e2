"""Warm-up and first calls inside a CUDA-graph capture, on the CPU (a fake capture flag, issue 23 item 1).

The pipeline runs for real but for NVRTC, the driver and the launch (``conftest.seam``): what these
tests see is what ``_kernel._load`` and ``warmup`` decide.
"""

from __future__ import annotations

import logging

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.optable import ROW_SCALE, TABLE, TENSOR_SCALE

from .conftest import Seam

torch = pytest.importorskip("torch")

KERNEL_SHAPE = (1, 4096, 4096)  # gemv: inside the sm90 plugin's measured region
FALLBACK_SHAPE = (1, 8192, 4096)  # gemv: N outside it


def gemv(m: int, n: int, k: int) -> object:
    x = torch.zeros((m, k), dtype=torch.bfloat16)
    w = torch.zeros((n, k), dtype=torch.bfloat16)
    return ops.gemv(x, w)


def test_warmup_loads_exactly_what_dispatch_then_launches(seam: Seam) -> None:
    report = ops.warmup(shapes={"gemv": [KERNEL_SHAPE, FALLBACK_SHAPE]})
    assert [p.path for p in report.planned] == ["kernel", "fallback"]
    assert len(seam.compiles) == 1 and len(seam.loads) == 1 and report.loaded == 1 and not report.failed
    assert report.fallbacks == ["gemv"] and ("gemv", 0, ops._kernel.thread_id()) in ops._kernel.fallback_ready
    seam.capturing = True
    gemv(*KERNEL_SHAPE)  # the warmed launcher: no compile, no load inside the capture
    assert seam.launches == [report.planned[0].launch.name_expression]  # type: ignore[union-attr]
    assert len(seam.compiles) == 1 and len(seam.loads) == 1
    stats = hwprofile.profile(0).stats.as_dict()
    assert stats["gemv"]["kernel"] == 1 and stats["kernels"]["compiles"] == 1 and stats["kernels"]["loads"] == 1


#: per op, one shape its kernel takes and one it does not, on the simulated H200
SHAPES = {"gemv": [KERNEL_SHAPE, (2, 4096, 4096)], "router_gemm": [(8, 256, 7168), (64, 256, 7168)]}
SHAPES["fp8_gemv"] = [(1, 4096, 4096), (1, 4096, 100)]


def test_warmup_routes_as_decide_does_for_every_op_and_scale_mode(seam: Seam) -> None:
    prof = hwprofile.profile(0)
    report = ops.warmup(shapes=SHAPES, fallbacks=False)
    assert {p.path for p in report.planned} == {"kernel", "fallback"}
    for p in report.planned:
        assert p.path == ops.decide(p.op, prof, m=p.shape[0], n=p.shape[1], k=p.shape[2]).path
    assert {p.mode for p in report.planned if p.op == "fp8_gemv"} == {TENSOR_SCALE, ROW_SCALE}
    t = ops._dispatch.table(0)
    kernel_keys = {(p.op, *p.shape, p.mode, t.split_k) for p in report.planned if p.path == "kernel"}
    assert kernel_keys == set(t.launches)


def test_unwarmed_first_call_in_capture_is_one_clear_error_and_compiles_nothing(seam: Seam) -> None:
    seam.capturing = True
    with pytest.raises(ops.NotWarmedError, match=r"gemv \(M=1, N=4096, K=4096\).*capture.*hwprofile\.ops\.warmup"):
        gemv(*KERNEL_SHAPE)
    assert not seam.compiles and not seam.loads and not seam.launches


def test_unwarmed_kernel_shape_in_capture_takes_a_ready_fallback_without_marking_the_kernel_failed(
    seam: Seam, caplog: pytest.LogCaptureFixture
) -> None:
    ops.warmup(shapes={"gemv": [FALLBACK_SHAPE]})  # initialises gemv's fallback only
    seam.capturing = True
    with caplog.at_level(logging.WARNING):
        gemv(*KERNEL_SHAPE)
        gemv(*KERNEL_SHAPE)
    assert not seam.compiles and not seam.launches
    assert caplog.text.count("inside a CUDA-graph capture") == 1
    seam.capturing = False
    gemv(*KERNEL_SHAPE)  # outside the capture the kernel loads as usual: it was not marked failed
    assert len(seam.compiles) == 1 and len(seam.launches) == 1


def test_a_kernel_loaded_for_another_shape_of_the_same_instance_is_used_in_capture(seam: Seam) -> None:
    ops.warmup(shapes={"gemv": [KERNEL_SHAPE]}, fallbacks=False)
    t = ops._dispatch.table(0)
    t.launches.clear()  # the table's launcher is gone, the loaded function is not (a lookup only, no load)
    seam.capturing = True
    gemv(*KERNEL_SHAPE)
    assert len(seam.loads) == 1 and len(seam.launches) == 1


def test_warmup_inside_a_capture_is_refused(seam: Seam) -> None:
    seam.capturing = True
    with pytest.raises(hwprofile.HwprofileError, match="inside a CUDA-graph capture"):
        ops.warmup(shapes={"gemv": [KERNEL_SHAPE]})


def test_warmup_by_served_model_covers_every_op_the_model_feeds(seam: Seam) -> None:
    from hwprofile import models

    catalog = models.load()
    name = next(n for n, m in catalog.items() if m.experts and m.fp8)
    report = ops.warmup(models=[name], fallbacks=False)
    chosen = models.select(catalog, [name])
    for op in TABLE:  # the gate kind too: its GEMM's shapes are the router's
        assert {p.shape for p in report.planned if p.op == op} == set(models.shapes(op, chosen))
    assert {op for op in TABLE if models.shapes(op, chosen)} == {p.op for p in report.planned} and len(report.planned) > 3
    assert "moe_gate" in {p.op for p in report.planned}  # the model has experts: its gate step is warmed too


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "give the shapes"),
        ({"shapes": {"nope": [(1, 2, 3)]}}, "no op 'nope'"),
        ({"shapes": {"gemv": [(1, 2)]}}, r"not \(M, N, K\)"),
        ({"shapes": {"gemv": [(1, True, 3)]}}, r"not \(M, N, K\)"),
        ({"models": ["no-such-model"]}, "unknown model"),
    ],
)
def test_warmup_refuses_bad_input_by_name(seam: Seam, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises((ValueError, hwprofile.HwprofileError), match=match):
        ops.warmup(**kwargs)  # type: ignore[arg-type]
