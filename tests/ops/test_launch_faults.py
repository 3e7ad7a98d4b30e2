"""Launch-time faults (CPU): a kernel that loads but whose launch the driver refuses is the documented fallback.

The real ``ops._kernel.launch`` runs over CPU tensors (``ops._dispatch._cpu_index`` makes them device 0
of a simulated device); ``hwprofile.kernels.load`` is replaced by one handing out a loaded kernel whose
launch fails as the driver would: a fake object raising ``KernelError``, or the real
:class:`~hwprofile.kernels.launch.LoadedKernel` over a fake driver that refuses ``cuFuncSetAttribute``
or ``cuLaunchKernel``. Also here: a planner that cannot plan is a gate that refuses (the issue's
``max_k`` raised with split-K off), and a property test that gate and planner agree on every target.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

import hwprofile  # noqa: E402
from hwprofile import catalog, ops  # noqa: E402
from hwprofile.errors import KernelError  # noqa: E402
from hwprofile.kernels import (  # noqa: E402
    _pipeline,
    limits,
    skinny_gemm,
)
from hwprofile.kernels import launch as klaunch  # noqa: E402
from hwprofile.kernels.spec import Launch  # noqa: E402
from hwprofile.optable import OPS  # noqa: E402

CLUSTER_REFUSED = "launching hwp120_gemv_simt<...> grid=(8, 2, 1) block=(128, 1, 1) smem=512 failed: CUDA_ERROR_CLUSTER_OUT_OF_RESOURCES"


class FailingKernel:
    """A loaded kernel whose every launch fails as ``LoadedKernel.launch`` reports a driver error."""

    def __init__(self, error: Exception) -> None:
        self.error, self.launches = error, 0

    def launch(self, launch: Launch, stream: int, args: Any) -> None:
        self.launches += 1
        raise self.error


#: a cost model (``<op>.model``, trend only) that predicts the kernel faster at every shape
KERNEL_FASTER = "kernel=0|10:100; fallback=50|10:0.01; near=0; n_weight=4; samples=2"


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch, no_downstream: None) -> Iterator[None]:
    monkeypatch.setenv("HWPROFILE_DEVICE", "rtx-pro-6000")
    # sm120's bandwidth rule predicts its bf16 GEMV a tie with cuBLAS (the fallback): these tests need the kernel's route
    monkeypatch.setenv("HWPROFILE_GEMV_MODEL", KERNEL_FASTER)
    hwprofile.reset()
    ops.reset_dispatch()
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    monkeypatch.setattr(ops._kernel, "raw_stream", lambda index: 0)
    yield
    ops.reset_dispatch()


def _load_gives(monkeypatch: pytest.MonkeyPatch, kern: Any) -> list[str]:
    loaded: list[str] = []

    def load(spec: Any, target: str, plan: Launch, index: int, arg_types: Any, **kw: Any) -> Any:
        loaded.append(plan.name_expression)
        return kern

    monkeypatch.setattr(_pipeline, "load", load)
    return loaded


def _xw(n: int = 256, k: int = 1024) -> tuple[Any, Any]:
    return torch.randn(1, k).to(torch.bfloat16), torch.randn(n, k).to(torch.bfloat16)


@pytest.mark.parametrize(
    "error",
    [KernelError(CLUSTER_REFUSED), RuntimeError("cuLaunchKernelEx: an unexpected binding error")],
    ids=["cuda-error", "other-exception"],
)
def test_launch_error_warns_once_naming_kernel_device_and_error_then_falls_back(
    seam: None, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    kern = FailingKernel(error)
    _load_gives(monkeypatch, kern)
    x, w = _xw()
    assert ops.decide("gemv", hwprofile.profile(0), m=1, n=256, k=1024).path == "kernel"
    with pytest.warns(RuntimeWarning, match="gemv kernel failed to launch on cuda:0 \\(NVIDIA RTX PRO 6000") as got:
        y = ops.gemv(x, w)
    assert len(got) == 1
    assert str(error) in str(got[0].message)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))  # this call's result: the fallback's
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning: later calls fall back silently, never relaunch
        torch.testing.assert_close(ops.gemv(x, w), torch.nn.functional.linear(x, w))
        out = torch.empty(1, 256, dtype=torch.bfloat16)
        assert ops.run_kernel("gemv", out, x, w) is False
    assert kern.launches == 1
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=256, k=1024)
    assert (d.path, d.gate) == ("fallback", "failed")
    table = ops._dispatch.table(0)
    assert "CUDA_ERROR_CLUSTER_OUT_OF_RESOURCES" in table.errors["gemv"] or "unexpected binding error" in table.errors["gemv"]
    assert not any(key[0] == "gemv" for key in table.launches)
    assert ops.decide("router_gemm", hwprofile.profile(0), m=4, n=256, k=7168).gate != "failed"  # only that kernel


def test_launch_error_in_strict_mode_raises_the_cuda_error(seam: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    _load_gives(monkeypatch, FailingKernel(KernelError(CLUSTER_REFUSED)))
    x, w = _xw()
    with pytest.raises(KernelError, match="CUDA_ERROR_CLUSTER_OUT_OF_RESOURCES"):
        ops.gemv(x, w)
    with pytest.raises(KernelError, match="not a CUDA error"):
        _load_gives(monkeypatch, FailingKernel(ValueError("not a CUDA error")))
        ops._dispatch.table(0).launches.clear()
        ops.gemv(x, w)


class FakeDriver:
    """Just enough of ``cuda.bindings.driver`` for :class:`LoadedKernel`: it refuses one call with one error."""

    def __init__(self, refuse: str, error: str) -> None:
        self.refuse, self.error = refuse, error
        self.CUresult = SimpleNamespace(CUDA_SUCCESS=0)
        self.CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
        self.calls: list[str] = []

    def cuGetErrorName(self, err: int) -> tuple[int, bytes]:
        return 0, self.error.encode()

    def _answer(self, name: str) -> tuple[int]:
        self.calls.append(name)
        return (1 if name == self.refuse else 0,)

    def cuFuncSetAttribute(self, *a: Any) -> tuple[int]:
        return self._answer("cuFuncSetAttribute")

    def cuLaunchKernel(self, *a: Any) -> tuple[int]:
        return self._answer("cuLaunchKernel")


@pytest.mark.parametrize(
    ("refuse", "what", "error", "k"),
    [  # a plan of 64 KiB shared memory: over 48 KiB, so the opt-in is asked for first
        ("cuFuncSetAttribute", "raising the shared-memory limit of gemv-instance to 65536 bytes", "CUDA_ERROR_INVALID_VALUE", 4096),
        ("cuLaunchKernel", "launching gemv-instance grid=", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 1024),
    ],
)
def test_real_loaded_kernel_refused_by_the_driver_is_the_fallback(
    seam: None, monkeypatch: pytest.MonkeyPatch, refuse: str, what: str, error: str, k: int
) -> None:
    monkeypatch.setenv("HWPROFILE_GEMV_MAX_K", str(k))
    monkeypatch.setenv("HWPROFILE_GEMV_SPLIT_K", "0")
    hwprofile.reset()
    ops.reset_dispatch()
    drv = FakeDriver(refuse, error)
    monkeypatch.setattr(klaunch, "_driver", lambda: drv)
    if refuse == "cuFuncSetAttribute":  # the kernels stream x past 32 KB now: pose a plan that stages 64 KiB
        plan = skinny_gemm.plan
        monkeypatch.setattr(skinny_gemm, "plan", lambda t, **kw: plan(t, **kw).replace(shared_bytes=65536))
    _load_gives(monkeypatch, klaunch.LoadedKernel(object(), "gemv-instance", ops._kernel.ARG_TYPES))
    x, w = _xw(256, k)
    assert ops.decide("gemv", hwprofile.profile(0), m=1, n=256, k=k).path == "kernel"
    with pytest.warns(RuntimeWarning, match=f"failed to launch on cuda:0.*: {what}.*failed: {error}"):
        y = ops.gemv(x, w)
    assert refuse in drv.calls
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))


# --- a planner that cannot plan is a gate that refuses --------------------------------------------


def test_issue_case_max_k_raised_with_split_k_off_is_planned_or_refused_never_raised(seam: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case (rtx-pro-6000, gemv.max_k 65536, split-K off, K = 51200): the kernels now stream x, so the
    planner takes it and the gate agrees; a planner that refuses the same shape is the "plan" gate, never its ValueError."""
    monkeypatch.setenv("HWPROFILE_GEMV_MAX_K", "65536")
    monkeypatch.setenv("HWPROFILE_GEMV_SPLIT_K", "0")
    hwprofile.reset()
    ops.reset_dispatch()
    p = hwprofile.profile(0)
    d = ops.decide("gemv", p, m=1, n=4096, k=51200)
    assert (d.path, d.gate) == ("kernel", None)
    p.kernels["gemv"].configure(m=1, n=4096, k=51200, split_k=False)  # what the gate let through, the planner plans

    plan = skinny_gemm.plan

    def refuse(t: Any, **kw: Any) -> Launch:
        if kw["k"] != 51200:
            return plan(t, **kw)
        raise ValueError(f"x of {2 * kw['k']} bytes exceeds the shared memory per block")

    monkeypatch.setattr(skinny_gemm, "plan", refuse)  # what the sm120 specs' configure calls
    hwprofile.reset()
    ops.reset_dispatch()
    loaded = _load_gives(monkeypatch, FailingKernel(AssertionError("never launched")))
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=4096, k=51200)
    assert (d.path, d.gate) == ("fallback", "plan")
    assert "planner refuses" in d.reason and "shared memory" in d.reason
    x, w = _xw(4096, 51200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(ops.gemv(x, w), torch.nn.functional.linear(x, w))
    assert loaded == []


def test_plan_gate_refuses_a_plan_past_the_targets_limits(seam: None, monkeypatch: pytest.MonkeyPatch) -> None:
    big = Launch("too_many_threads<>", (8, 16, 1), (2048, 1, 1), 0)
    monkeypatch.setattr(skinny_gemm, "plan", lambda t, **kw: big)  # what the sm120 specs' configure calls
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=4096, k=4096)
    assert d.gate == "plan"
    assert "2048 threads per block" in d.reason and "portable cluster is at most 8" in d.reason


# --- gate and planner agree, every simulated target, any in-bounds setting ------------------------

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

TARGETS = list(catalog.CATALOG)  # every simulated device; those no plugin with kernels serves have nothing to agree on


def _profile(sim: str, env: dict[str, str]) -> Any:
    with mock.patch.dict(os.environ, {"HWPROFILE_DEVICE": sim, **env}):
        hwprofile.reset()
        return hwprofile.profile(0)


def test_the_simulated_targets_include_every_plugin_target() -> None:
    served = {_profile(n, {}).target for n in TARGETS if _profile(n, {}).kernels}
    assert {"sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a"} <= served


@pytest.mark.parametrize("sim", TARGETS)
@hypothesis.settings(max_examples=40, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(data=st.data())
def test_gate_and_planner_agree_for_any_setting_and_shape(sim: str, data: Any) -> None:
    """Inside the kernel's limits the plan gate refuses exactly what the planner cannot plan (or plans past the target's
    limits), so whatever the measured shapes and the model send to the kernel, the planner plans: under the shipped
    settings, and under a model that predicts the kernel everywhere (then every plannable shape takes the kernel)."""
    op = data.draw(st.sampled_from(list(OPS)), label="op")
    env = {
        f"HWPROFILE_{op.upper()}_MAX_K": str(data.draw(st.integers(1, 1 << 20), label="max_k")),
        "HWPROFILE_GEMV_SPLIT_K": data.draw(st.sampled_from(["0", "1"]), label="split_k"),
    }
    kernel_model = data.draw(st.booleans(), label="a model predicting the kernel")
    if kernel_model:
        env |= {f"HWPROFILE_{op.upper()}_MODEL": KERNEL_FASTER, f"HWPROFILE_{op.upper()}_MEASURED": ""}
    prof = _profile(sim, env)
    if op not in prof.kernels:
        return
    r = ops._dispatch._Table(prof).routes[op]
    hypothesis.assume(r.off is None and r.min_n <= r.max_n and r.min_k <= r.max_k)
    m = data.draw(st.integers(1, min(r.max_m, 16)), label="m")
    n = data.draw(st.integers(r.min_n, min(r.max_n, 1 << 18)), label="n")
    k = data.draw(st.integers(r.min_k, r.max_k), label="k")
    k -= k % r.k_multiple
    n -= n % r.n_multiple
    hypothesis.assume(r.min_k <= k and r.min_n <= n and not r.roof_lo <= n < r.roof_hi)
    d = ops.decide(op, prof, m=m, n=n, k=k)  # every limit admits the shape: the plan gate, then measured shapes or the model
    split = bool(prof["gemv.split_k"])
    problems = []
    for sc in OPS[op].scale_modes if OPS[op].scaled else (None,):
        try:
            plan = prof.kernels[op].configure(m=m, n=n, k=k, split_k=split, **({} if sc is None else {"scale": sc}))
        except ValueError as exc:
            problems.append(str(exc))
            continue
        problems += limits.check(prof.target, plan.grid, plan.block, plan.shared_bytes, cluster=plan.grid[1])
    assert d.gate in (None, "plan", "measured", "model"), (sim, op, m, n, k, d)
    assert (d.gate == "plan") == bool(problems), (sim, op, m, n, k, d, problems)
    if problems:
        assert d.path == "fallback" and problems[0] in d.reason
    if kernel_model:
        assert (d.path == "kernel") == (not problems), (sim, op, m, n, k, d, problems)
