"""The sm90 plugin's measured thresholds: each carries the stamp of its sweep, and that stamp still holds.

The stamps take the fallback function from hwprofile's op table (``measured_stamp``), so they follow
the table. What the sweeps actually measured against is recorded here, from the ``[stamp.fallback]``
of the sweep files (benchmarks/h200/2026-11-30-sweeps-3 for router_gemm, linear_bf16_fp32 and gemv;
-sweeps-4 for fp8_gemv, re-swept against the chunked fallback): a change of an op's fallback in
hwprofile fails the first test until that op is re-swept on the H200 and its record updated.
"""

from __future__ import annotations

from typing import Any

import pytest

import hwprofile_sm90
from hwprofile.plugin import OPS, Stamp, Value, profile_for, simulated_device

#: one record per sweep behind a shipped threshold: (op, the fallback function its [stamp.fallback] names)
SWEEPS = (
    ("router_gemm", "torch.mm(out_dtype=torch.float32)"),
    ("linear_bf16_fp32", "torch.mm(out_dtype=torch.float32)"),
    ("gemv", "torch.nn.functional.linear"),
    ("fp8_gemv", "chunked exact bf16 dequantise + torch.mm(out_dtype=torch.float32) + fp32 scale"),
)
MEASURED_AGAINST = dict(SWEEPS)
H200 = simulated_device((9, 0), "NVIDIA H200")


def shipped() -> dict[str, Any]:
    return hwprofile_sm90.hwprofile_settings(H200, {})


def test_each_stamp_names_the_fallback_its_sweep_measured() -> None:
    stamps = {v.stamp.op: v.stamp for v in shipped().values() if isinstance(v, Value) and v.stamp is not None}
    assert set(stamps) == set(MEASURED_AGAINST)
    for op, stamp in stamps.items():
        assert stamp.fallback["function"] == MEASURED_AGAINST[op], (
            f"{op}: hwprofile's fallback is now {OPS[op].fallback!r}, the shipped thresholds were measured against "
            f"{MEASURED_AGAINST[op]!r}: re-sweep {op} on the H200 (hwprofile sweep {op})"
        )
        assert dict(stamp.fallback) == {"function": OPS[op].fallback, "torch": "2.11.0", "cublas": "13.1.0.3", "cublaslt": "13.1.0.3"}


def test_every_stamped_value_is_a_threshold_of_its_stamps_op() -> None:
    for key, v in shipped().items():
        if isinstance(v, Value) and v.stamp is not None:
            assert isinstance(v.stamp, Stamp) and key.split(".")[0] == v.stamp.op, key
            assert key in OPS[v.stamp.op].bound_keys(), f"{key}: a stamp covers the bounds of the op's kernel region"


@pytest.mark.parametrize("key", sorted(k for k, v in shipped().items() if isinstance(v, Value) and v.stamp is not None))
def test_shipped_thresholds_are_not_stale_for_this_source(key: str) -> None:
    """An edit of kernels/sm90_gemv.cu (or a header it includes) marks every threshold stale: re-sweep, or prove
    the dispatched code unchanged before recording the new source digest in the stamps."""
    prof = profile_for(H200)
    layer = next(layer for layer in prof.explain(key).chain if layer.kind == "arch")
    assert layer.stamp is not None and not layer.stale, f"{key}: {layer.stale}"
