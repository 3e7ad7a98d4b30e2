"""``hwprofile explain OP --shape MxNxK``: the path, both paths' times (measured or predicted) and what they rest on,
for every kind of op in the table (the gate kind too), and on SKUs nobody measured ("predicted, not measured on this SKU").

Simulated devices only: the decision is the dispatch's own ``route``, which needs no GPU.
"""

from __future__ import annotations

import json

import pytest

import hwprofile
from hwprofile.cli import main
from hwprofile.optable import TABLE


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    hwprofile.reset()


@pytest.mark.parametrize("device", ["h200", "gb300", "rtx-pro-6000"])
def test_a_shape_the_cost_model_decides_shows_both_predicted_times(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    # 4 tokens, 64 experts, hidden 2048: a router no catalog model has at these sizes on this grid
    code, out, err = run(capsys, "explain", "router_gemm", "--shape", "4x64x2048", "--simulate", device)
    assert code == 0, err
    assert "(cost model)" in out
    assert "predicted: kernel " in out and "fallback " in out
    code, out, _ = run(capsys, "explain", "router_gemm", "--shape", "4x64x2048", "--simulate", device, "--json")
    doc = json.loads(out)
    assert doc["basis"] == "model" and doc["kernel_us"] > 0 and doc["fallback_us"] > 0
    assert (doc["path"] == "kernel") == (doc["kernel_us"] < doc["fallback_us"])
    if device == "h200":  # the shipped, fitted model: the nearest measured shapes correct it
        assert "fitted on NVIDIA H200" in doc["reason"] and "nearest measured shapes" in doc["reason"]
    else:  # no sm100 / sm120 measurement: the plugin's default model, said so
        assert "predicted, not measured on this SKU" in doc["reason"] and "the trend alone" in doc["reason"]


def test_a_measured_shape_says_measured_with_both_times(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_GEMV_MEASURED", "1x2048x16384=kernel:3.1/7.2")
    hwprofile.reset()
    code, out, err = run(capsys, "explain", "gemv", "--shape", "1x2048x16384", "--simulate", "h200")
    assert code == 0, err
    assert "(measured at this shape)" in out and "measured: kernel 3.1 µs, fallback 7.2 µs" in out
    code, out, _ = run(capsys, "explain", "gemv", "--shape", "1x2048x16384", "--simulate", "h200", "--json")
    doc = json.loads(out)
    assert (doc["basis"], doc["kernel_us"], doc["fallback_us"], doc["path"]) == ("measured", 3.1, 7.2, "kernel")


def test_a_kernel_limit_names_the_bound_and_predicts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "gemv", "--shape", "2x4096x4096", "--simulate", "h200", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["basis"], doc["gate"], doc["path"]) == ("limit", "m", "fallback")
    assert doc["kernel_us"] is None and doc["fallback_us"] is None
    code, out, _ = run(capsys, "explain", "gemv", "--shape", "2x4096x4096", "--simulate", "h200")
    assert code == 0 and "(kernel limit)" in out and "predicted" not in out


@pytest.mark.parametrize("device", ["h200", "gb300", "rtx-pro-6000"])
def test_the_gate_kind_is_explained_like_every_op(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "moe_gate" in TABLE
    code, out, err = run(capsys, "explain", "moe_gate", "--shape", "4x256x7168", "--simulate", device, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["op"] == "moe_gate" and doc["basis"] == "model" and doc["path"] == "kernel"
    assert doc["kernel_us"] < doc["fallback_us"]  # one launch against torch's GEMM and a dozen selection launches
    assert "predicted, not measured on this SKU" in doc["reason"]  # nobody swept the fused gate yet, on any SKU
    code, out, _ = run(capsys, "explain", "moe_gate", "--shape", "17x256x7168", "--simulate", device)
    assert code == 0 and "(kernel limit)" in out and "moe_gate.max_tokens=16" in out


def test_decide_of_the_gate_carries_the_predicted_times() -> None:
    from hwprofile import ops
    from hwprofile.plugin import profile_for, simulated_device

    prof = profile_for(simulated_device((9, 0)))
    d = ops.decide_moe_gate(prof, m=2, n=256, k=7168, n_group=8, topk_group=4, top_k=8)
    assert d.basis == "model" and d.kernel_us is not None and d.fallback_us is not None
    assert d.path == ("kernel" if d.kernel_us < d.fallback_us else "fallback")
    assert ops.decide("moe_gate", prof, m=2, n=256, k=7168).kernel_us == d.kernel_us  # same route, plain selection


def test_shape_errors_name_the_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "explain", "gemv", "--shape", "1x-4x4", "--simulate", "h200")
    assert code == 2 and "M, N and K must be >= 0" in err
    code, _, err = run(capsys, "explain", "gemv.max_n", "--shape", "1x1x1", "--simulate", "h200")
    assert code == 2 and "give an op" in err and "moe_gate" in err
