"""Every dispatch gate, reached through the public ops on the CPU.

A seam makes CPU tensors count as device 0 of a simulated H200 (``ops._dispatch._cpu_index``) and replaces the
kernel launcher (``ops._kernel.launch``) with a fake that computes the kernel's result in float64 and
records the call. So each test below drives the real routing of the real op; deleting any gate of
``ops.route`` makes one of them fail (checked by mutation, see the ops helper's report).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.optable import OPS
from hwprofile.plugin import PREBUILT_SHAPES

torch = pytest.importorskip("torch")


class FakeLauncher:
    """Stands in for ``ops._kernel.launch``: records (op, M, N, K, scale mode) and writes the op's exact result: its float64
    reference (tests/ops/reference.py), never a product assumed for every op; an op without one fails here, by name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, int, int]] = []
        self.split_ks: list[bool | None] = []  #: the split-K each launch asked for (None: the profile's)
        self.fail = False

    def __call__(
        self, t: Any, op: str, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int, mode: int, split_k: bool | None = None
    ) -> bool:
        self.split_ks.append(split_k)
        assert out.is_contiguous() and x.is_contiguous() and w.is_contiguous(), "the kernel ABI takes contiguous operands"
        assert (out.shape, x.shape, w.shape) == ((m, n), (m, k), (n, k))
        if self.fail:
            return False
        from .reference import REFERENCES

        assert op in REFERENCES, f"the fake kernel cannot compute {op!r}: it has no float64 reference in tests/ops/reference.py"
        self.calls.append((op, m, n, k, mode))
        out.copy_(REFERENCES[op](x, w, *(() if scale is None else (scale,))).to(out.dtype))
        return True

    def gate(self, t: Any, ids: Any, weights: Any, logits: Any, bias: Any, m: int, n: int, n_group: int, topk_group: int,
             top_k: int, renormalize: bool, scaling: float) -> bool:
        """Stands in for ``ops._gate.launch`` (moe_gate's selection kernel): records ("moe_gate", M, N, n_group, top_k) and
        writes the float64 rules' result."""
        from .reference import moe_gate as reference

        assert logits.is_contiguous() and logits.dtype == torch.float32 and tuple(logits.shape) == (m, n)
        assert ids.dtype == torch.int64 and tuple(ids.shape) == tuple(weights.shape) == (m, top_k)
        if self.fail:
            return False
        self.calls.append(("moe_gate", m, n, n_group, top_k))
        ref_ids, ref_w = reference(logits, bias, n_group, topk_group, top_k, renormalize, scaling)
        ids.copy_(ref_ids)
        weights.copy_(ref_w.float())
        return True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, no_downstream: None) -> Iterator[FakeLauncher]:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    # the bounds these tests probe, pinned (the user layer wins), so re-tuned plugin values do not move them
    for key, value in {"ROUTER_GEMM_MAX_TOKENS": "16", "LINEAR_BF16_FP32_MAX_TOKENS": "8", "GEMV_MAX_N": "12288", "GEMV_MAX_K": "4096",
                       "FP8_GEMV_MIN_N": "64", "FP8_GEMV_MIN_K": "512"}.items():
        monkeypatch.setenv(f"HWPROFILE_{key}", value)
    hwprofile.reset()
    ops.reset_dispatch()
    launcher = FakeLauncher()
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    monkeypatch.setattr(ops._kernel, "launch", launcher)
    monkeypatch.setattr(ops._gate, "launch", launcher.gate)
    yield launcher
    ops.reset_dispatch()


_real_launch = ops._kernel.launch


def rand(*shape: int, dtype: Any = None) -> Any:
    return torch.randn(*shape).to(dtype or torch.bfloat16)


def zeros(*shape: int) -> Any:
    """Cheap operands for tests that only look at routing."""
    return torch.zeros(*shape, dtype=torch.bfloat16)


def fp8(n: int, k: int) -> Any:
    return (torch.randn(n, k) * 2).to(torch.float8_e4m3fn)


def took_kernel(fake: FakeLauncher, fn: Any, *args: Any, **kw: Any) -> bool:
    before = len(fake.calls)
    fn(*args, **kw)
    return len(fake.calls) > before


def env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for k, v in values.items():
        monkeypatch.setenv(f"HWPROFILE_{k.upper()}", v)
    hwprofile.reset()
    ops.reset_dispatch()


#: cost models (``<op>.model``, trend only: ``near=0``) under which one path is predicted faster at every shape
KERNEL_FASTER = "kernel=0|10:100; fallback=50|10:0.01; near=0; n_weight=4; samples=2"
FALLBACK_FASTER = "kernel=50|10:0.01; fallback=0|10:100; near=0; n_weight=4; samples=2"


def predict(monkeypatch: pytest.MonkeyPatch, op: str, model: str, measured: str = "") -> None:
    """Pin ``op``'s cost model and per-shape table (the user layer wins), so the expected route is known at every shape:
    the kernel's limits first, then ``measured``, then ``model``."""
    env(monkeypatch, **{f"{op}_model": model, f"{op}_measured": measured})


# --- router_gemm: the kernel's limits are the only box; inside, measured shapes, then the model -------


@pytest.mark.parametrize("m", [1, 6, 16])
@pytest.mark.parametrize("n", [256, 320, 384])
def test_router_inside_the_measured_region_takes_the_kernel(fake: FakeLauncher, m: int, n: int) -> None:
    h, w = rand(m, 7168), rand(n, 7168)
    out = ops.router_gemm(h, w)
    assert fake.calls == [("router_gemm", m, n, 7168, 0)]
    assert out.dtype == torch.float32 and out.shape == (m, n)


ROUTER_CASES = [
    (17, 256, 7168, "m"),  # above router_gemm.max_tokens
    (4, 255, 7168, "n"), (4, 385, 7168, "n"), (1, 1024, 7168, "n"),  # N outside 256..384
    (4, 256, 7160, "k"), (4, 256, 7176, "k"), (4, 256, 4096, "k"),  # K other than 7168
]


@pytest.mark.parametrize(("m", "n", "k", "gate"), ROUTER_CASES)
def test_router_outside_the_kernels_limits_falls_back_and_decide_says_why(
    fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int, gate: str
) -> None:
    """Limits set to the old measured box (N 256..384, K = 7168): outside them the fallback, whatever the model predicts."""
    predict(monkeypatch, "router_gemm", KERNEL_FASTER)
    env(monkeypatch, router_gemm_min_n="256", router_gemm_max_n="384", router_gemm_min_k="7168", router_gemm_max_k="7168")
    h, w = zeros(m, k), zeros(n, k)
    assert not took_kernel(fake, ops.router_gemm, h, w)
    d = ops.decide("router_gemm", hwprofile.profile(0), m=m, n=n, k=k)
    assert (d.path, d.gate, d.basis) == ("fallback", gate, "limit")
    assert {"m": "router_gemm.max_tokens=16", "n": "router_gemm.max_n", "k": "router_gemm.min_k"}[gate] in d.reason


@pytest.mark.parametrize(("m", "n", "k"), [c[:3] for c in ROUTER_CASES if c[3] != "m"])
def test_router_unmeasured_shape_inside_the_kernels_limits_takes_the_predicted_path(
    fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int
) -> None:
    """The same shapes under the kernel's own limits: the model decides, and decide says it predicted."""
    prof = hwprofile.profile(0)
    shipped = ops.decide("router_gemm", prof, m=m, n=n, k=k)  # sm90's model, fitted on the H200 catalog
    assert shipped.basis == "model" and shipped.reason.startswith("predicted: kernel")
    assert shipped.kernel_us is not None and shipped.fallback_us is not None
    assert (shipped.path == "kernel") == (shipped.kernel_us < shipped.fallback_us)
    for model, path in ((KERNEL_FASTER, "kernel"), (FALLBACK_FASTER, "fallback")):
        predict(monkeypatch, "router_gemm", model)
        assert took_kernel(fake, ops.router_gemm, zeros(m, k), zeros(n, k)) == (path == "kernel")
        d = ops.decide("router_gemm", hwprofile.profile(0), m=m, n=n, k=k)
        assert (d.path, d.basis, d.gate) == (path, "model", None if path == "kernel" else "model"), d.reason


def test_router_deepgemm_vocab_width_is_not_measured(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepGEMM's N = 129280 is inside the kernel's limits but no sweep measured it: decide says the model decided and
    on what (both predicted times), never that it was measured; a user limit below it holds whatever the model says."""
    from hwprofile import costmodel

    prof = hwprofile.profile(0)
    d = ops.decide("router_gemm", prof, m=1, n=129280, k=7168)
    r = ops._dispatch._Table(prof).routes["router_gemm"]
    assert (1, 129280, 7168) not in r.measured and r.model is not None
    p = costmodel.predict(r.model, r.times, 1, 129280, 7168)
    assert (d.basis, d.kernel_us, d.fallback_us) == ("model", p.kernel_us, p.fallback_us)
    assert d.path == ("kernel" if p.kernel else "fallback") and "measured at this shape" not in d.reason
    assert "nearest measured shapes" in d.reason and "router_gemm.model from hwprofile-sm90" in d.reason
    predict(monkeypatch, "router_gemm", KERNEL_FASTER)
    env(monkeypatch, router_gemm_max_n="384")
    d = ops.decide("router_gemm", hwprofile.profile(0), m=1, n=129280, k=7168)
    assert (d.path, d.gate) == ("fallback", "n") and "router_gemm.max_n" in d.reason


def test_router_k_multiple_gate(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    env(monkeypatch, router_gemm_min_k="7000", router_gemm_max_k="7200")
    assert took_kernel(fake, ops.router_gemm, rand(2, 7176), rand(256, 7176))
    assert not took_kernel(fake, ops.router_gemm, rand(2, 7172), rand(256, 7172))  # 16-byte loads need K % 8 == 0
    assert ops.decide("router_gemm", hwprofile.profile(0), m=2, n=256, k=7172).gate == "k_multiple"


def test_empty_problems_never_launch_and_decide_does_not_blame_the_threshold(fake: FakeLauncher) -> None:
    assert ops.router_gemm(rand(0, 7168), rand(256, 7168)).shape == (0, 256)
    assert ops.router_gemm(rand(4, 7168), rand(0, 7168)).shape == (4, 0)
    z = ops.router_gemm(rand(4, 0), rand(256, 0))
    assert z.shape == (4, 256) and z.dtype == torch.float32 and not z.any()
    assert fake.calls == []
    d = ops.decide("router_gemm", hwprofile.profile(0), m=0, n=256, k=7168)
    assert d.gate == "empty" and "max_tokens" not in d.reason and "M=0" in d.reason


# --- linear_bf16_fp32 (M <= 8 pinned above; the kernel's limits: N 1..262144, K 8..65536, K % 8) ---------


def test_linear_gates(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    predict(monkeypatch, "linear_bf16_fp32", KERNEL_FASTER)  # only the limits refuse
    assert took_kernel(fake, ops.linear_bf16_fp32, rand(8, 7168), rand(4096, 7168))
    assert not took_kernel(fake, ops.linear_bf16_fp32, rand(9, 7168), rand(256, 7168))  # M above max_tokens
    assert took_kernel(fake, ops.linear_bf16_fp32, rand(4, 7168), rand(4104, 7168))  # no N box but the kernel's
    assert took_kernel(fake, ops.linear_bf16_fp32, rand(4, 7168), rand(128, 7168))
    assert took_kernel(fake, ops.linear_bf16_fp32, rand(4, 4096), rand(256, 4096))  # nor a K box
    assert not took_kernel(fake, ops.linear_bf16_fp32, rand(4, 4100), rand(256, 4100))  # K % 8: 16-byte loads
    assert not took_kernel(fake, ops.linear_bf16_fp32, rand(4, 4), rand(256, 4))  # K below the kernel's min_k
    assert ops.decide("linear_bf16_fp32", hwprofile.profile(0), m=4, n=256, k=4).gate == "k"
    # the model predicting the fallback: a measured shape still takes what was measured (sm90's sweep: the kernel)
    predict(monkeypatch, "linear_bf16_fp32", FALLBACK_FASTER, measured="8x4096x7168=kernel:17.754/20.803")
    assert took_kernel(fake, ops.linear_bf16_fp32, rand(8, 7168), rand(4096, 7168))
    assert not took_kernel(fake, ops.linear_bf16_fp32, rand(4, 7168), rand(4096, 7168))
    d = ops.decide("linear_bf16_fp32", hwprofile.profile(0), m=4, n=4096, k=7168)
    assert (d.gate, d.basis) == ("model", "model")


# --- gemv (limits pinned: N 64..12288, K 512..4096, K % 8, N % 8, M = 1) ----------------------------------


def test_gemv_gates(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    predict(monkeypatch, "gemv", KERNEL_FASTER)  # only the limits refuse
    env(monkeypatch, gemv_min_k="512")
    assert took_kernel(fake, ops.gemv, rand(1, 4096), rand(4096, 4096))
    assert took_kernel(fake, ops.gemv, rand(4096), rand(2048, 4096))  # [K] -> [N]: M = 1
    assert not took_kernel(fake, ops.gemv, rand(2, 4096), rand(4096, 4096))  # M = 2
    assert not took_kernel(fake, ops.gemv, rand(1, 4096), rand(12296, 4096))  # N > max_n
    assert not took_kernel(fake, ops.gemv, rand(1, 4096), rand(56, 4096))  # N < min_n
    assert not took_kernel(fake, ops.gemv, rand(1, 4096), rand(2052, 4096))  # N % 8
    assert not took_kernel(fake, ops.gemv, rand(1, 4608), rand(2048, 4608))  # K > max_k
    assert took_kernel(fake, ops.gemv, rand(1, 1000), rand(2048, 1000))  # K % 8 is all the kernel's 16-byte loads need
    assert took_kernel(fake, ops.gemv, rand(1, 2880), rand(2048, 2880))  # gpt-oss's hidden size (not a multiple of 512)
    assert not took_kernel(fake, ops.gemv, rand(1, 1004), rand(2048, 1004))  # K % 8
    assert ops.decide("gemv", hwprofile.profile(0), m=1, n=2048, k=1004).gate == "k_multiple"
    assert not took_kernel(fake, ops.gemv, rand(1, 256), rand(2048, 256))  # K < min_k
    env(monkeypatch, gemv_cublas_roof_n_min="2048", gemv_cublas_roof_n_max="4096")
    assert not took_kernel(fake, ops.gemv, rand(1, 4096), rand(2048, 4096))  # inside the roof gap
    assert ops.decide("gemv", hwprofile.profile(0), m=1, n=2048, k=4096).gate == "roof"
    assert took_kernel(fake, ops.gemv, rand(1, 4096), rand(4096, 4096))  # the gap ends before 4096


def test_measured_shapes_decide_first_then_the_model(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the kernel's limits: a shape of ``<op>.measured`` takes the path measured there, any other the model's."""
    table = "1x2048x4096=fallback:9.5/8.1; 1x4096x4096=kernel:11.9/14.0"
    predict(monkeypatch, "gemv", KERNEL_FASTER, measured=table)
    assert not took_kernel(fake, ops.gemv, rand(1, 4096), rand(2048, 4096))
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=2048, k=4096)
    assert (d.path, d.gate, d.basis, d.kernel_us, d.fallback_us) == ("fallback", "measured", "measured", 9.5, 8.1)
    assert took_kernel(fake, ops.gemv, rand(1, 4096), rand(4096, 4096))
    assert took_kernel(fake, ops.gemv, rand(1, 4096), rand(2056, 4096))  # next to it, unmeasured: the model
    predict(monkeypatch, "gemv", FALLBACK_FASTER, measured=table)
    assert took_kernel(fake, ops.gemv, rand(1, 4096), rand(4096, 4096))  # measured: the kernel, whatever the model says
    assert not took_kernel(fake, ops.gemv, rand(1, 4096), rand(2056, 4096))
    assert ops.decide("gemv", hwprofile.profile(0), m=1, n=2056, k=4096).gate == "model"
    predict(monkeypatch, "gemv", "")  # no model at all: nothing predicts the kernel faster
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=2056, k=4096)
    assert (d.path, d.gate) == ("fallback", "model") and "no cost model (gemv.model is empty" in d.reason


def test_a_model_the_user_set_is_named_as_theirs_not_as_a_default(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model from HWPROFILE_<OP>_MODEL is nobody's default and was fitted on no SKU hwprofile knows of."""
    predict(monkeypatch, "gemv", KERNEL_FASTER)
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=2056, k=4096)
    assert d.basis == "model" and "gemv.model set by the user (environment HWPROFILE_GEMV_MODEL), unstamped" in d.reason
    assert "default" not in d.reason and "not measured on this SKU" not in d.reason


# --- fp8_gemv -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_gates_and_scale_modes(fake: FakeLauncher, per_row: bool) -> None:
    n, k = 2048, 4096
    scale = torch.rand(n) + 0.5 if per_row else torch.tensor(0.5)
    ops.fp8_gemv(rand(1, k), fp8(n, k), scale)
    mode = ops.ROW_SCALE if per_row else ops.TENSOR_SCALE
    assert fake.calls == [("fp8_gemv", 1, n, k, mode)]
    for m in (2, 3, 9, 16):  # the tensor-core kernel reads the weight once for every token up to 16
        assert took_kernel(fake, ops.fp8_gemv, rand(m, k), fp8(n, k), scale)
        assert fake.calls[-1] == ("fp8_gemv", m, n, k, mode)
    assert took_kernel(fake, ops.fp8_gemv, rand(2, 4, k), fp8(n, k), scale)  # leading dims flatten to M = 8
    assert not took_kernel(fake, ops.fp8_gemv, rand(17, k), fp8(n, k), scale)
    assert ops.decide("fp8_gemv", hwprofile.profile(0), m=17, n=n, k=k).gate == "m"


def test_fp8_k_must_suit_16_byte_loads_whatever_the_setting(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    env(monkeypatch, fp8_gemv_k_multiple="8")
    s = torch.tensor([1.0])
    assert took_kernel(fake, ops.fp8_gemv, rand(1, 1024), fp8(256, 1024), s)
    assert not took_kernel(fake, ops.fp8_gemv, rand(1, 1032), fp8(256, 1032), s)  # 1032 % 16 != 0
    assert "16-byte loads need 16" in ops.decide("fp8_gemv", hwprofile.profile(0), m=1, n=256, k=1032).reason


# --- state gates: deterministic, no kernel, kernel failed, layout ---------------------------------------


def test_deterministic_mode(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    env(monkeypatch, deterministic="1")
    assert not took_kernel(fake, ops.router_gemm, rand(2, 7168), rand(256, 7168))
    assert ops.decide("router_gemm", hwprofile.profile(0), m=2, n=256, k=7168).gate == "deterministic"


def test_no_plugin_no_kernel(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    env(monkeypatch, device="l40s")
    assert not took_kernel(fake, ops.router_gemm, rand(2, 7168), rand(256, 7168))
    d = ops.decide("router_gemm", hwprofile.profile(0), m=2, n=256, k=7168)
    assert d.gate == "no_kernel" and "no architecture plugin" in d.reason


def test_kernel_that_fails_to_load_warns_once_then_the_gate_says_failed(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.errors import KernelCompileError
    from hwprofile.kernels import _pipeline as jit

    monkeypatch.setattr(ops._kernel, "launch", _real_launch)  # the real launcher: load (fails here), then launch
    loads = []

    def boom(*a: object, **k: object) -> None:
        loads.append(1)
        raise KernelCompileError("NVRTC failed to compile kernel 'router_gemm' of plugin sm90 for sm_90a: error")

    monkeypatch.setattr(jit, "load", boom)
    h, w = rand(2, 7168), rand(256, 7168)
    with pytest.warns(RuntimeWarning, match="router_gemm kernel unavailable"):
        out = ops.router_gemm(h, w)
    assert out.dtype == torch.float32 and float((out.double() - h.double() @ w.double().t()).abs().max()) < 1e-2
    ops.router_gemm(h, w)  # no second load attempt, no second warning
    assert loads == [1]
    d = ops.decide("router_gemm", hwprofile.profile(0), m=2, n=256, k=7168)
    assert d.gate == "failed" and "HWPROFILE_STRICT" in d.reason and "verification against float64 (or self-test)" in d.reason
    assert hwprofile.profile(0).stats.as_dict()["router_gemm"] == {"kernel": 0, "fallback": 2}


def test_strict_mode_raises_the_load_error(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.errors import KernelError
    from hwprofile.kernels import _pipeline as jit

    env(monkeypatch, strict="1")
    monkeypatch.setattr(ops._kernel, "launch", _real_launch)

    def boom(*a: object, **k: object) -> None:
        raise KernelError("cannot load")

    monkeypatch.setattr(jit, "load", boom)
    with pytest.raises(KernelError, match="cannot load"):
        ops.gemv(rand(1, 4096), rand(4096, 4096))


def test_layout_gate_padded_weight_and_misaligned_input(fake: FakeLauncher) -> None:
    k = 7168
    wide = rand(256, k + 64)
    w = wide[:, :k]  # row stride K + 64: a padded weight
    h = rand(2, k)
    out = ops.router_gemm(h, w)
    assert fake.calls == []
    assert float((out.double() - h.double() @ w.double().t()).abs().max()) < 1e-2
    base = rand(2 * k + 1)
    hm = base[1:].view(2, k)  # contiguous but 2 bytes off 16-byte alignment
    ops.router_gemm(hm, rand(256, k))
    assert fake.calls == []
    ops.router_gemm(h, rand(256, k))
    assert len(fake.calls) == 1


def test_non_contiguous_out_is_written_by_the_fallback(fake: FakeLauncher) -> None:
    h, w = rand(3, 7168), rand(256, 7168)
    big = torch.full((256, 3), float("nan"))
    out = big.t()  # [3, 256], not contiguous
    r = ops.router_gemm(h, w, out=out)
    assert r is out and fake.calls == [] and not torch.isnan(big).any()
    c = torch.empty(3, 256)
    assert ops.router_gemm(h, w, out=c) is c and len(fake.calls) == 1  # contiguous out: the kernel writes it
    assert torch.allclose(c, out, atol=1e-2)


def test_decide_agrees_with_the_ops(fake: FakeLauncher) -> None:
    """decide() is the ops' routing: same answer for every shape tried."""
    prof = hwprofile.profile(0)
    cases = [("router_gemm", m, n, 7168) for m in (0, 1, 16, 17) for n in (0, 255, 256, 384, 385)]
    cases += [("gemv", 1, n, k) for n in (64, 2048, 12288, 12296) for k in (512, 1000, 4096, 4608)]
    cases += [("linear_bf16_fp32", m, n, 7168) for m in (1, 8, 9) for n in (256, 4096, 4104)]
    fns = {op: getattr(ops, op) for op, *_ in cases}
    for op, m, n, k in cases:
        ran = took_kernel(fake, fns[op], zeros(m, k), zeros(n, k))
        assert ran == (ops.decide(op, prof, m=m, n=n, k=k).path == "kernel"), (op, m, n, k)


def test_counts_reach_the_profile_stats(fake: FakeLauncher) -> None:
    prof = hwprofile.profile(0)
    ops.router_gemm(rand(2, 7168), rand(256, 7168))
    ops.router_gemm(rand(20, 7168), rand(256, 7168))
    ops.router_gemm(rand(0, 7168), rand(256, 7168))
    assert prof.stats.as_dict()["router_gemm"] == {"kernel": 1, "fallback": 2}


@pytest.mark.parametrize("n", [0, 1, 64])
@pytest.mark.parametrize("shape", [(1, 1), (2,), (1, 64), (3, 1)])
def test_a_scale_that_is_neither_per_tensor_nor_per_row_is_refused(fake: FakeLauncher, n: int, shape: tuple[int, ...]) -> None:
    """The eager front reads the scale's shape itself; any shape but [], [1] or [N] must reach the validating path."""
    if shape in ((1,), (n,)):
        pytest.skip("a valid scale for this N")
    with pytest.raises(ValueError, match="scale must have 1 element"):
        ops.fp8_gemv(rand(1, 512), fp8(n, 512), torch.ones(shape))
    assert not fake.calls


@pytest.mark.parametrize("name", list(OPS))
def test_every_op_takes_its_documented_argument_names(fake: FakeLauncher, name: str) -> None:
    """Each public op's parameters are the op table's argument names (router_gemm: hidden, weight), by position and by name."""
    import inspect

    op, fn = OPS[name], getattr(ops, name)
    assert list(inspect.signature(fn).parameters) == [*op.args, "out"]
    args = [rand(2, 512), fp8(64, 512) if op.scaled else rand(64, 512)] + ([torch.ones(64)] if op.scaled else [])
    by_position, by_name = fn(*args), fn(**dict(zip(op.args, args, strict=True)))
    assert torch.equal(by_position, by_name)
    with pytest.raises(TypeError):
        fn(*args[:1], nonsense=args[1])


def test_a_reset_while_a_route_is_computed_leaves_no_stale_memo(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread's reset() between the table lookup and the memo store must not leave the old table's route behind."""
    h, w = rand(4, 7168), rand(256, 7168)
    real_route = ops.route

    def route_then_reset(*a: Any, **kw: Any) -> Any:
        gate = real_route(*a, **kw)
        monkeypatch.setattr(ops._dispatch, "route", real_route)
        monkeypatch.setenv("HWPROFILE_DETERMINISTIC", "1")  # what the other thread changed before its reset
        hwprofile.reset()
        return gate

    monkeypatch.setattr(ops._dispatch, "route", route_then_reset)
    ops.router_gemm(h, w)  # its route was computed before the reset (either path is right for this one call)
    assert not any(took_kernel(fake, ops.router_gemm, h, w) for _ in range(3))  # later calls see the new settings
    assert ops.decide("router_gemm", hwprofile.profile(0), m=4, n=256, k=7168).gate == "deterministic"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # forking with threads is the point
def test_a_fork_while_another_thread_holds_the_dispatch_lock_leaves_the_child_able_to_route(fake: FakeLauncher) -> None:
    """A table build holds the dispatch lock while profile() runs; a worker forked meanwhile must still route new shapes."""
    import os
    import threading

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ops._dispatch._tables_lock:
            held.set()
            release.wait(30)

    x, w = zeros(1, 512), zeros(64, 512)  # made before the fork: the child runs no torch compute (its
    # OpenMP pool is not fork-safe once the parent used it, as on a many-core GPU host)
    launched: list[str] = []
    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(30)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            threading.Timer(30, lambda: os._exit(3)).start()
            ops._kernel.launch = lambda t, op, *a: launched.append(op) or True  # record only
            ops.gemv(x, w)  # a shape the memo has not seen: takes the lock
            code = 0 if launched == ["gemv"] else 2
        finally:
            os._exit(code)
    release.set()
    t.join(30)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _edges(r: Any) -> list[tuple[str, tuple[int, int, int], str | None]]:
    """(what, (M, N, K), expected gate) just inside and just outside each bound of one op's route."""
    k0 = max(r.min_k, r.k_multiple)
    k0 += -k0 % r.k_multiple
    n0 = r.min_n + (-r.min_n % r.n_multiple)
    if r.roof_lo <= n0 < r.roof_hi:
        n0 = r.roof_hi + (-r.roof_hi % r.n_multiple)
    out: list[tuple[str, tuple[int, int, int], str | None]] = [
        ("inside", (1, n0, k0), None),
        ("M above max_m", (r.max_m + 1, n0, k0), "m"),
        ("N below min_n", (1, r.min_n - 1, k0), "n" if r.min_n > 1 else "empty"),
        ("N above max_n", (1, r.max_n + r.n_multiple, k0), "n"),
        ("K below min_k", (1, n0, r.min_k - 1), "k" if r.min_k > 1 else "empty"),
        ("K above max_k", (1, n0, r.max_k + r.k_multiple), "k"),
        ("M at max_m", (r.max_m, n0, k0), None),
    ]
    if r.k_multiple > 1 and k0 + 1 <= r.max_k:
        out.append(("K off its multiple", (1, n0, k0 + 1), "k_multiple"))
    if r.n_multiple > 1 and n0 + 1 <= r.max_n:
        out.append(("N off its multiple", (1, n0 + 1, k0), "n_multiple"))
    if r.roof_lo < r.roof_hi and r.min_n <= r.roof_lo <= r.max_n:
        out.append(("N at the roof", (1, r.roof_lo + (-r.roof_lo % r.n_multiple), k0), "roof"))
    return out


@pytest.mark.parametrize("name", list(PREBUILT_SHAPES))  # the ops the simulated H200's plugin has a kernel for
def test_every_bound_of_every_op_is_a_gate(fake: FakeLauncher, name: str) -> None:
    """Over the op table: a shape just inside each bound takes the kernel, just outside takes the fallback, naming the gate."""
    prof = hwprofile.profile(0)
    r = ops._dispatch._Table(prof).routes[name]
    assert r.off is None, f"{name}: the simulated H200 has no {name} kernel ({r.off})"
    for what, (m, n, k), gate in _edges(r):
        if m < 1 or n < 0 or k < 0:
            continue
        d = ops.decide(name, prof, m=m, n=n, k=k)
        assert d.gate == gate, f"{name} {what} (M={m}, N={n}, K={k}): gate {d.gate!r}, expected {gate!r} ({d.reason})"
