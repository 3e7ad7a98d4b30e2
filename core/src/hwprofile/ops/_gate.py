"""``ops.moe_gate``: the gate op of the op table's second contract kind (``optable.GATES``). Never imports torch at import.

The gate is the router GEMM (``hidden [M, K] bf16 . weight [N, K]^T`` -> fp32 logits) followed by the
expert selection. A plugin ships one fused kernel for it (``KernelSpec(op="moe_gate")``: sm90
``hwprofile_sm90/moe_gate.py``, sm100 / sm120 on the skinny-GEMM family through
``hwprofile.plugin.plan_skinny_gate``): GEMM, scores, bias, grouped top-k, renormalisation and
scaling in **one launch** (``hwprofile/moe_gate.cuh``). Its ABI is :data:`ARG_TYPES`, its plan
``configure(m=, n=, k=, split_k=, n_group=, topk_group=, top_k=)``.

Routing (:func:`route_gate`): the GEMM box of the op table's entry (``moe_gate.max_tokens``,
``min_n`` .. ``max_n``, ``min_k`` .. ``max_k``, resolved per device by ``_dispatch._Route`` and decided
by ``_dispatch.route``, so ``empty``, ``deterministic``, ``no_kernel`` and ``failed`` read as for every
op), then ``plan`` (the plugin's planner refuses the selection: a ValueError naming the bound), then
``layout`` per call. The answer and the launch plan are remembered per (device, M, N, K, n_group,
topk_group, top_k): a call plans once (issue 35: it used to plan twice). The fallback is plain torch
(:func:`fallback`: ``torch.mm(out_dtype=float32)`` then :func:`select_torch`), the function a sweep
times and ``torch.compile`` traces; a call that needs gradients computes its logits through
``router_gemm``'s custom op (its backward) and selects in torch.

Capture safety: inside a CUDA-graph capture nothing is compiled or loaded and no workspace is
allocated: a fused kernel not loaded yet, or a device without its counter workspace, takes the
fallback if that ran in this thread before (``_kernel.fallback_ready``), else
:class:`~hwprofile.ops.NotWarmedError` names the op and the shape; ``hwprofile.ops.warmup`` loads the
kernel, allocates the workspace and runs the fallback once.

The counter workspace: the kernel's last CTA is found with a device-wide ticket word that is zero
between launches (the last CTA's own ``atom.inc`` wraps it to zero: nothing resets it, on the host or
the device). Each device has one buffer of :data:`COUNTER_SLOTS` words, allocated once and never
freed (a captured graph keeps its address); an eager launch uses its stream's slot, a launch being
captured a slot of its own, so two launches that may run at once never share a counter.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NoReturn

from .. import _state
from .._log import get_logger
from ..errors import KernelError, NotWarmedError
from ..optable import MOE_GATE
from . import _dispatch, _kernel

if TYPE_CHECKING:
    from ..kernels import Launch
    from ..profiles import Profile

OP: Final = MOE_GATE.name
#: the fused kernel's C signature: (ids int64*, weights f32*, logits f32*, counter u32*, x bf16*, w bf16*,
#: bias f32* or null, M, N, K, n_group, topk_group, top_k, flags, routed_scaling_factor)
ARG_TYPES: Final = (ctypes.c_void_p,) * 7 + (ctypes.c_int,) * 7 + (ctypes.c_float,)
RENORM: Final = 1  # flags (hwprofile/moe_gate.cuh kRenorm, kSoftmax)
SOFTMAX: Final = 2


def selection_flags(renormalize: bool, scoring: str) -> int:
    """The kernel's flags word for a selection: one place, so a call, warm-up and ``explain`` verify the same instance."""
    return (RENORM if renormalize else 0) | (SOFTMAX if scoring == "softmax" else 0)


#: counter words per device: stream slots for eager launches, then one per launch captured into a graph
COUNTER_SLOTS: Final = 1 << 16
_STREAM_SLOTS: Final = 1 << 10

log = get_logger(__name__)

#: device index -> why the fused kernel failed there (cleared with the device's dispatch table)
failed: dict[int, str] = {}
_lock = threading.Lock()
_routes: dict[int, tuple[Any, Any]] = {}  # device index -> (its dispatch table, the gate's _Route on it)
_memo: dict[tuple[int, int, int, int, int, int, int], tuple[Any, Any, str | None, Any]] = {}  # see _remember
_loaded: dict[tuple[int, str], Any] = {}  # (device index, name expression) -> LoadedKernel
#: (id of a launch plan, flags, has bias) -> that plan, once its instance has a passing verdict here (ops._verify): one dict
#: lookup per launch; the plan object is held so its id cannot be reused by another
_verified: dict[tuple[int, int, bool], Any] = {}
_workspace: dict[int, Any] = {}  # device index -> int32 [COUNTER_SLOTS] zeros: never freed (graphs keep its address)
_stream_slot: dict[tuple[int, int], int] = {}  # (device, raw stream) -> its eager slot
_captured_next: dict[int, int] = {}  # device -> next slot for a launch being captured
_warned_capture: set[tuple[int, int, int]] = set()


def _new_table(t: _dispatch._Table) -> None:
    """A rebuilt dispatch table (a reset, a new profile): the gate's routes, memos, failures and launchers of that device go."""
    with _lock:
        failed.pop(t.index, None)
        _routes.pop(t.index, None)
        for key in [key for key in _memo if key[0] == t.index]:
            del _memo[key]
        for loaded in [key for key in _loaded if key[0] == t.index]:
            del _loaded[loaded]
        _verified.clear()


_dispatch.on_new_table.append(_new_table)


@_state.on_reset
def _forget() -> None:
    with _lock:
        failed.clear()
        _routes.clear()
        _memo.clear()
        _loaded.clear()  # the workspace stays: a captured graph may still point at it
        _verified.clear()


# --- routing ---------------------------------------------------------------------------------------


def _route_of(t: _dispatch._Table) -> Any:
    """The gate's ``_dispatch._Route`` on table ``t`` (its box resolved from the profile once)."""
    got = _routes.get(t.index)
    if got is not None and got[0] is t:
        return got[1]
    r = _dispatch._Route(MOE_GATE, t.prof)  # type: ignore[arg-type]  # a GateDef has the bounds an OpDef has
    r.plan_problem = lambda m, n, k: None  # the plan needs the selection too: route_gate asks it
    if t.index in failed:
        r.off = "failed"
    _routes[t.index] = (t, r)
    return r


def served_route(prof: Profile, overrides: Any = None) -> Any:
    """A ``_dispatch._Route`` of the gate on ``prof`` (``overrides``: setting values standing above the profile's, as a
    sweep's result) whose ``plan`` gate asks the plugin's planner with the served router's selection at (N, K)
    (``MOE_GATE.router_for``): what ``hwprofile sweep moe_gate`` times, reports and routes by."""
    r = _dispatch._Route(MOE_GATE, prof, overrides=overrides)  # type: ignore[arg-type]  # a GateDef has the bounds an OpDef has
    split = bool(prof["gemv.split_k"])

    def problem(m: int, n: int, k: int) -> str | None:
        if OP not in prof.kernels:
            return None  # the no_kernel gate says so first
        s = MOE_GATE.router_for(n, k)
        return plan(prof, m, n, k, s.n_group, s.topk_group, s.top_k, split)[1]

    r.plan_problem = problem
    return r


def plan(prof: Profile, m: int, n: int, k: int, n_group: int, topk_group: int, top_k: int, split_k: bool) -> tuple[Any, str | None]:
    """``(launch, None)``, or ``(None, why)`` when the plugin's planner refuses the gate (its words)."""
    spec = prof.kernels[OP]
    try:
        return spec.configure(m=m, n=n, k=k, split_k=split_k, n_group=n_group, topk_group=topk_group, top_k=top_k), None
    except ValueError as exc:
        return None, str(exc)


def route_gate(t: _dispatch._Table, m: int, n: int, k: int, n_group: int, topk_group: int, top_k: int) -> tuple[str | None, Any, str]:
    """``(gate, launch, words)``: ``gate`` None sends the call to the fused kernel with ``launch``; else the gate that refused."""
    r = _route_of(t)
    gate = _dispatch.route(r, m, n, k)
    if gate is None:
        launch, why = plan(t.prof, m, n, k, n_group, topk_group, top_k, t.split_k)
        if launch is None:
            return "plan", None, f"the {OP} kernel of {r.who} cannot take M={m}, N={n}, K={k}, n_group={n_group}, " \
                                 f"topk_group={topk_group}, top_k={top_k}: {why}"
        return None, launch, _dispatch._reason(r, None, m, n, k)
    if gate == "failed" and t.index in failed:
        return gate, None, f"the {OP} kernel failed in this process on cuda:{t.index}: {failed[t.index]}"
    return gate, None, _dispatch._reason(r, gate, m, n, k)


def decide(prof: Profile, *, m: int, n: int, k: int, n_group: int = 1, topk_group: int = 1, top_k: int = 8) -> _dispatch.Decision:
    """The path ``ops.moe_gate`` takes on ``prof``'s device for ``m`` tokens, ``n`` experts, hidden ``k``, with the reason.

    CUDA operands without gradients, contiguous and aligned, are assumed (a call that needs
    gradients takes the torch path, which autograd sees). ``ops.decide("moe_gate", ...)`` is this with
    a plain top-``min(8, n)`` selection.
    """
    for name, v in (("m", m), ("n", n), ("k", k), ("n_group", n_group), ("topk_group", topk_group), ("top_k", top_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"decide_moe_gate: {name} must be an int >= 0, got {v!r}")
    t = _dispatch._tables.get(prof.device.index)
    if t is None or t.prof is not prof:
        t = _dispatch._Table(prof)
    gate, _, words = route_gate(t, m, n, k, n_group, topk_group, top_k)
    r = _route_of(t)
    kernel_us, fallback_us = _dispatch.times(r, gate, m, n, k)  # measured or predicted where either decided, as for every op
    return _dispatch.Decision(
        OP, "kernel" if gate is None else "fallback", words, gate, _dispatch.basis(r, gate, m, n, k), kernel_us, fallback_us
    )


_dispatch.decide_gate = decide  # ops.decide("moe_gate", ...): _dispatch reaches the gate kind through this, never by import


def _remember(idx: int, key: tuple[int, int, int, int, int, int, int]) -> tuple[Any, Any, str | None, Any]:
    """(table, the gate's route on it, gate, launch plan) of one call shape, remembered: a repeated shape looks up nothing else."""
    t = _dispatch.table(idx)
    _, m, n, k, n_group, topk_group, top_k = key
    gate, launch, _ = route_gate(t, m, n, k, n_group, topk_group, top_k)
    hit = (t, _route_of(t), gate, launch)
    with _lock:
        if len(_memo) >= 4096:
            _memo.clear()
        _memo[key] = hit
    return hit


# --- the torch path --------------------------------------------------------------------------------

_torch: Any = None
_Tensor: Any = None  # torch.Tensor, torch.bfloat16, torch.float32 once bound: check() compares by identity
_BF16: Any = None
_F32: Any = None
_SCORINGS: Final = MOE_GATE.scorings


def bind(torch: Any) -> None:
    global _torch, _Tensor, _BF16, _F32
    _torch, _Tensor, _BF16, _F32 = torch, torch.Tensor, torch.bfloat16, torch.float32


def select_torch(logits: Any, bias: Any, n_group: int, topk_group: int, top_k: int, renormalize: bool, scaling: float,
                 scoring: str = "sigmoid") -> tuple[Any, Any]:
    """The expert selection on fp32 router logits ``[M, N]``: ``(ids int64, weights fp32)`` ``[M, top_k]``.

    The rules of transformers' ``DeepseekV3TopkRouter`` and SGLang's ``biased_grouped_topk`` /
    ``grouped_topk``: scores = sigmoid(logits) (``scoring="softmax"``: softmax over N, the Qwen /
    Mixtral / DeepSeek-V2 routers); choice = scores + bias; with groups, a group's score is the sum
    of its top-2 choice values (softmax: its largest, DeepSeek-V2's rule); the ``topk_group`` best
    groups stay; the ``top_k`` best choice values among their experts are picked (other groups'
    experts are -inf, as SGLang: transformers fills 0.0, which differs only where a biased score is
    <= 0); weights are the *unbiased* scores of the picked experts, divided by their sum + 1e-20 if
    ``renormalize``, times ``scaling``. Ties go to the lower group and the lower expert index (stable
    sorts), and ids come in descending order of choice value.
    """
    torch = _torch
    m, n = logits.shape
    scores = logits.softmax(dim=-1) if scoring == "softmax" else logits.sigmoid()
    choice = scores if bias is None else scores + bias
    if n_group > 1:
        per = n // n_group
        grouped = choice.view(m, n_group, per)
        group_scores = grouped.amax(dim=-1) if scoring == "softmax" else grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        # the dropped groups' experts to -inf through a broadcast mask: no negation, no [M, N] mask copy (two launches fewer)
        drop = torch.ones((m, n_group), dtype=torch.bool, device=logits.device).scatter_(1, keep, False)
        choice = grouped.masked_fill(drop.unsqueeze(-1), float("-inf")).view(m, n)
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if scaling != 1.0:
        weights = weights * scaling
    return ids, weights


def fallback(x: Any, w: Any, bias: Any, n_group: int, topk_group: int, top_k: int, renormalize: bool, scaling: float,
             scoring: str = "sigmoid") -> tuple[Any, Any]:
    """The gate's torch fallback on 2-D operands: fp32 logits by ``torch.mm(out_dtype=float32)``, then :func:`select_torch`.

    What the op runs off its kernel, what ``hwprofile sweep moe_gate`` times against it, and what
    ``torch.compile`` traces (inductor fuses the selection); its identity is ``MOE_GATE.fallback``.
    """
    from ._fallbacks import mm_fp32

    return select_torch(mm_fp32(x, w), bias, n_group, topk_group, top_k, renormalize, scaling, scoring)


# --- the eager entry -------------------------------------------------------------------------------


def check(hidden: Any, weight: Any, bias: Any, top_k: Any, n_group: Any, topk_group: Any, scoring: Any) -> tuple[int, int]:
    """moe_gate's arguments against its contract; returns (N, K). Errors name the argument.

    Every eager call pays for it (issue 43: the op's +28.7 us over its fallback at M = 32), so each rule reads an
    attribute once and compares dtypes by identity; devices are compared as the cheap ``get_device()`` index and,
    off CUDA, as ``device`` objects (cpu against meta).
    """
    tensor, bf16 = _Tensor, _BF16
    for name, t in (("hidden", hidden), ("weight", weight)):
        if not isinstance(t, tensor):
            raise TypeError(f"moe_gate: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype is not bf16:
            raise ValueError(f"moe_gate: {name} must be torch.bfloat16, got {t.dtype}")
    wshape, hshape = weight.shape, hidden.shape
    if len(wshape) != 2:
        raise ValueError(f"moe_gate: weight must have 2 dimensions [N, K], got shape {tuple(wshape)}")
    n, k = wshape
    if not hshape or hshape[-1] != k:
        raise ValueError(f"moe_gate: hidden must be [..., K] with K={k} (from weight {tuple(wshape)}), got {tuple(hshape)}")
    dev = weight.get_device()
    if hidden.get_device() != dev or (dev < 0 and hidden.device != weight.device):
        raise ValueError(f"moe_gate: weight is on {weight.device} but hidden is on {hidden.device}; put them on one device")
    if not (type(top_k) is int and type(n_group) is int and type(topk_group) is int and top_k >= 1 and n_group >= 1 and topk_group >= 1):
        _bad_counts(top_k, n_group, topk_group)
    if scoring not in _SCORINGS:
        raise ValueError(f"moe_gate: scoring must be one of {', '.join(map(repr, _SCORINGS))}, got {scoring!r}")
    if n % n_group:
        raise ValueError(f"moe_gate: N={n} experts (weight rows) do not split into n_group={n_group} equal groups")
    per = n // n_group
    if n_group > 1 and per < 2 and scoring == "sigmoid":
        raise ValueError(
            f"moe_gate: a group's score sums its top-2 experts, so groups need >= 2 experts; got {per} (N={n}, n_group={n_group})"
        )
    if topk_group > n_group:
        raise ValueError(f"moe_gate: topk_group={topk_group} > n_group={n_group}")
    if top_k > topk_group * per:
        raise ValueError(f"moe_gate: top_k={top_k} > the {topk_group * per} experts of topk_group={topk_group} groups of {per}")
    if bias is not None and (
        not isinstance(bias, tensor)
        or bias.dtype is not _F32
        or bias.shape != (n,)
        or bias.get_device() != dev
        or (dev < 0 and bias.device != weight.device)
        or (bias.requires_grad and _dispatch._grad_enabled())
    ):
        _bad_bias(bias, weight, n, dev)
    return int(n), int(k)


def _bad_counts(top_k: Any, n_group: Any, topk_group: Any) -> NoReturn:
    """:func:`check`'s error for a group count that is not an int >= 1, naming the first such argument.

    Out of line so the eager path pays one combined test, not a loop (it runs only when that test failed).
    """
    for name, v in (("top_k", top_k), ("n_group", n_group), ("topk_group", topk_group)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"moe_gate: {name} must be an int >= 1, got {v!r}")
    raise AssertionError(f"moe_gate: no bad count among top_k={top_k!r}, n_group={n_group!r}, topk_group={topk_group!r}")


def _bad_bias(bias: Any, weight: Any, n: int, dev: int) -> NoReturn:
    """:func:`check`'s error for a ``bias`` that broke a rule, tested again in :func:`check`'s order to name which.

    Out of line so a valid bias (every DeepSeek-V3 call passes one) costs one combined test on the eager path.
    """
    if not isinstance(bias, _Tensor) or bias.dtype is not _F32 or bias.shape != (n,):
        got = f"{bias.dtype} {tuple(bias.shape)}" if isinstance(bias, _Tensor) else type(bias).__name__
        raise ValueError(f"moe_gate: bias (e_score_correction_bias) must be float32 of shape ({n},), got {got}")
    if bias.get_device() != dev or (dev < 0 and bias.device != weight.device):
        raise ValueError(f"moe_gate: bias is on {bias.device} but weight is on {weight.device}; put them on one device")
    if bias.requires_grad and _dispatch._grad_enabled():
        raise ValueError(
            "moe_gate: bias requires grad, but the correction bias gets no gradient (it is updated outside autograd); detach it"
        )
    raise AssertionError(f"moe_gate: no rule broken by bias {tuple(bias.shape)} on {bias.device}")


def check_scalars(renormalize: Any, scaling: Any) -> float:
    """``renormalize`` a bool and ``routed_scaling_factor`` a finite real number > 0 (returned as a float).

    Python scalars, checked once per call with a type test and ``math.isfinite`` (no tensor work): a
    NaN or inf factor would make every weight NaN or inf, ``'2.5'`` would fail deep in torch, and
    ``renormalize='no'`` would read as true.
    """
    if not isinstance(renormalize, bool):
        raise TypeError(f"moe_gate: renormalize must be a bool (True or False), got {type(renormalize).__name__} {renormalize!r}")
    if isinstance(scaling, bool) or not isinstance(scaling, numbers.Real):
        raise TypeError(
            f"moe_gate: routed_scaling_factor must be a real number (a float such as 2.5), got {type(scaling).__name__} {scaling!r}"
        )
    value = float(scaling)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"moe_gate: routed_scaling_factor must be finite and > 0 (the model config's value, 1.0 for none), got {value!r}")
    return value


def call(hidden: Any, weight: Any, bias: Any, top_k: int, n_group: int, topk_group: int, renormalize: bool, scaling: float,
         scoring: str) -> tuple[Any, Any]:
    """``ops.moe_gate``'s entry: eager, compiled (:func:`_compiled`) or with gradients; returns ``[..., top_k]`` ids and weights."""
    n, k = check(hidden, weight, bias, top_k, n_group, topk_group, scoring)
    scaling = check_scalars(renormalize, scaling)
    lead = hidden.shape[:-1]
    if _dispatch._compiling():
        ids, wts = _compiled(hidden, weight, bias, n, k, top_k, n_group, topk_group, renormalize, scaling, scoring)
    else:
        x = hidden if len(lead) == 1 else hidden.reshape(-1, k)
        ids, wts = eager(x, weight, bias, n, k, top_k, n_group, topk_group, renormalize, scaling, scoring)
    if len(lead) != 1:
        ids, wts = ids.reshape(*lead, top_k), wts.reshape(*lead, top_k)
    return ids, wts


def eager(x: Any, w: Any, bias: Any, n: int, k: int, top_k: int, n_group: int, topk_group: int, renormalize: bool, scaling: float,
          scoring: str) -> tuple[Any, Any]:
    """A checked 2-D call, eagerly: the fused kernel where the route says so, else the torch path."""
    m = x.shape[0]
    if (x.requires_grad or w.requires_grad) and _dispatch._grad_enabled():
        from ._dispatch import ENTRIES

        logits = ENTRIES[MOE_GATE.gemm].custom(x, w)  # router_gemm's custom op: its backward
        return select_torch(logits, bias, n_group, topk_group, top_k, renormalize, scaling, scoring)
    idx = x.get_device()
    if idx < 0:
        idx = _dispatch._cpu_index if x.is_cpu and (bias is None or bias.is_cpu) else -1
    if idx >= 0:
        key = (idx, m, n, k, n_group, topk_group, top_k)
        hit = _memo.get(key)
        t, r, gate, launch_plan = hit if hit is not None else _remember(idx, key)
        if gate is None and not _misplaced(x, w, bias):
            got = launch(t, launch_plan, x, w, bias, m, n, k, n_group, topk_group, top_k, renormalize, scaling, scoring)
            if got is not None:
                r.counts["kernel"] += 1
                return got
        r.counts["fallback"] += 1
        if m == 0 or n == 0:
            return x.new_empty((m, top_k), dtype=_torch.int64), x.new_empty((m, top_k), dtype=_torch.float32)
        if (OP, idx, _kernel.thread_id()) not in _kernel.fallback_ready:
            _kernel.first_fallback(OP, idx, f"M={m}, N={n}, K={k}")
    elif m == 0:
        return x.new_empty((m, top_k), dtype=_torch.int64), x.new_empty((m, top_k), dtype=_torch.float32)
    return fallback(x, w, bias, n_group, topk_group, top_k, renormalize, scaling, scoring)


def _misplaced(x: Any, w: Any, bias: Any) -> bool:
    return _dispatch._misplaced((x, w, bias)) or not (x.is_cuda or _dispatch._cpu_index >= 0)


# --- compiled --------------------------------------------------------------------------------------

_traced_route: Any = None  # _trace_route under torch.compiler.assume_constant_result, bound by define()
_custom: Any = None  # torch.ops.hwprofile.moe_gate.default, bound by define()


def _trace_route(idx: int, m: int, n: int, k: int, n_group: int, topk_group: int, top_k: int, contiguous: bool) -> bool:
    """Whether the fused kernel takes this static-shape call (at trace time; ``idx`` -1: not a routed device)."""
    if idx < 0 or not contiguous:
        return False
    gate, _, _ = route_gate(_dispatch.table(idx), m, n, k, n_group, topk_group, top_k)
    if gate is not None and idx != _dispatch._cpu_index:
        from ._fallbacks import probe_mm_out_dtype

        probe_mm_out_dtype(idx)  # the traced fallback then reads a settled answer
    return gate is None


def _compiled(hidden: Any, w: Any, bias: Any, n: int, k: int, top_k: int, n_group: int, topk_group: int, renormalize: bool,
              scaling: float, scoring: str) -> tuple[Any, Any]:
    """The gate while ``torch.compile`` traces it: routed now where the shapes are static.

    A kernel route is one custom op (``torch.ops.hwprofile.moe_gate``: one launch per step, nothing
    of the selection in the graph); a fallback route the plain torch ops (inductor fuses the
    selection); a dynamic shape the custom op, which routes at run time; a call that needs gradients
    router_gemm's custom op (its backward) and the torch selection.
    """
    x = hidden if hidden.dim() == 2 else hidden.reshape(-1, k)  # a 2-D hidden state: no aten.view around the custom op
    if (hidden.requires_grad or w.requires_grad) and _dispatch._grad_enabled():
        from ._dispatch import ENTRIES

        return select_torch(ENTRIES[MOE_GATE.gemm].custom(x, w), bias, n_group, topk_group, top_k, renormalize, scaling, scoring)
    if all(_dispatch._static(d) for d in (*hidden.shape, *w.shape)):
        dev = hidden.device
        idx = dev.index if dev.type == "cuda" else _dispatch._cpu_index if dev.type == "cpu" else -1
        contiguous = hidden.is_contiguous() and w.is_contiguous() and (bias is None or bias.is_contiguous())
        m = x.shape[0]
        if not _traced_route(-1 if idx is None else idx, m, n, k, n_group, topk_group, top_k, contiguous):
            if m == 0:
                return x.new_empty((0, top_k), dtype=_torch.int64), x.new_empty((0, top_k), dtype=_torch.float32)
            return fallback(x, w, bias, n_group, topk_group, top_k, renormalize, scaling, scoring)
    return _custom(x, w, bias, top_k, n_group, topk_group, renormalize, float(scaling), scoring)  # type: ignore[no-any-return]


def define(torch: Any, lib: Any) -> None:
    """Define ``torch.ops.hwprofile.moe_gate`` on ``lib`` (``_library.register``): its kernel is the eager entry, plus a fake."""
    global _traced_route, _custom
    bind(torch)
    lib.define(
        f"{OP}(Tensor hidden, Tensor weight, Tensor? bias, int top_k, int n_group, int topk_group, bool renormalize, "
        "float routed_scaling_factor, str scoring) -> (Tensor, Tensor)"
    )

    def impl(x: Any, w: Any, bias: Any, top_k: int, n_group: int, topk_group: int, renormalize: bool, scaling: float,
             scoring: str) -> tuple[Any, Any]:
        n, k = check(x, w, bias, top_k, n_group, topk_group, scoring)
        return eager(x if x.dim() == 2 else x.reshape(-1, k), w, bias, n, k, top_k, n_group, topk_group, renormalize, scaling, scoring)

    def fake(x: Any, w: Any, bias: Any, top_k: int, n_group: int, topk_group: int, renormalize: bool, scaling: float,
             scoring: str) -> tuple[Any, Any]:
        check(x, w, bias, top_k, n_group, topk_group, scoring)
        m = x.shape[0]
        return x.new_empty((m, top_k), dtype=torch.int64), x.new_empty((m, top_k), dtype=torch.float32)

    lib.impl(OP, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{lib.ns}::{OP}", fake, lib=lib)
    _custom = getattr(getattr(torch.ops, lib.ns), OP).default
    _traced_route = torch.compiler.assume_constant_result(_trace_route)


# --- the kernel --------------------------------------------------------------------------------------


def _fail(t: _dispatch._Table, why: str) -> None:
    with _lock:
        failed[t.index] = why
        for key in [key for key in _memo if key[0] == t.index]:
            del _memo[key]
        for loaded in [key for key in _loaded if key[0] == t.index]:
            del _loaded[loaded]
        got = _routes.get(t.index)
        if got is not None:
            got[1].off = "failed"
    warnings.warn(f"hwprofile: the moe_gate kernel is unavailable on cuda:{t.index}, using the torch path from now on: {why}",
                  RuntimeWarning, stacklevel=6)  # _fail <- launch <- eager <- call <- ops.moe_gate <- the caller


def _counter(t: _dispatch._Table, device: Any, stream: int, capturing: bool) -> int | None:
    """Address of the counter word this launch uses; None inside a capture before the device's workspace exists."""
    ws = _workspace.get(t.index)
    if ws is None:
        if capturing:
            return None
        with _lock:
            ws = _workspace.get(t.index)
            if ws is None:
                ws = _workspace[t.index] = _torch.zeros(COUNTER_SLOTS, dtype=_torch.int32, device=device)
    if capturing:  # a slot of its own: graphs replayed on different streams never share a counter
        with _lock:
            slot = _captured_next.get(t.index, _STREAM_SLOTS)
            _captured_next[t.index] = slot + 1 if slot + 1 < COUNTER_SLOTS else _STREAM_SLOTS
        if slot + 1 >= COUNTER_SLOTS:
            log.warning("moe_gate: more than %d launches captured on cuda:%d; their counters are reused from the first",
                        COUNTER_SLOTS - _STREAM_SLOTS, t.index)
    else:
        slot = _stream_slot.get((t.index, stream), -1)
        if slot < 0:
            with _lock:
                slot = _stream_slot.setdefault((t.index, stream), len(_stream_slot) % _STREAM_SLOTS)
    return int(ws.data_ptr()) + 4 * slot


def _kernel_for(t: _dispatch._Table, plan: Launch, capturing: bool) -> Any:
    """The loaded fused kernel (memoised per device); None inside a capture when it is not loaded yet."""
    from .. import kernels

    key = (t.index, plan.name_expression)
    kern = _loaded.get(key)
    if kern is not None:
        return kern
    spec, target = t.prof.kernels[OP], t.prof.target
    if target is None:
        raise KernelError(f"moe_gate: the profile of device {t.index} has no NVRTC target")
    if capturing:
        kern = kernels.loaded(spec, target, plan, t.index, ARG_TYPES)
        if kern is None:
            return None
    else:
        kern = kernels.load(spec, target, plan, t.index, ARG_TYPES, record=t.prof.stats.record)
    _loaded[key] = kern
    return kern


def _not_ready(t: _dispatch._Table, m: int, n: int, k: int, what: str) -> None:
    """Inside a capture, the kernel (or its workspace) is not ready: the fallback if that is safe, else NotWarmedError."""
    fix = f"call hwprofile.ops.warmup(device={t.index}, shapes={{'moe_gate': [({m}, {n}, {k})]}}) before capturing"
    if (OP, t.index, _kernel.thread_id()) not in _kernel.fallback_ready:
        raise NotWarmedError(
            f"moe_gate (M={m}, N={n}, K={k}) was first called inside a CUDA-graph capture on cuda:{t.index}: {what}, and its "
            f"fallback never ran on this device in this thread (cuBLAS); either would break the capture; {fix}"
        )
    if (t.index, m, n) not in _warned_capture:
        _warned_capture.add((t.index, m, n))
        log.warning("moe_gate (M=%d, N=%d, K=%d) inside a CUDA-graph capture on cuda:%d: %s, the capture records the torch path; %s",
                    m, n, k, t.index, what, fix)


def launch(t: _dispatch._Table, plan: Launch, x: Any, w: Any, bias: Any, m: int, n: int, k: int, n_group: int, topk_group: int,
           top_k: int, renormalize: bool, scaling: float, scoring: str) -> tuple[Any, Any] | None:
    """Launch the fused kernel on checked operands: ``(ids, weights)``, or None (the caller takes the torch path).

    None after one warning, the first time, if the kernel cannot be built, loaded or launched here
    (strict mode raises); None inside a capture when it is not ready and the fallback is. The test
    seam: CPU tests replace it with a fake.
    """
    if t.index in failed and not t.strict:
        return None
    from .. import kernels

    capturing = _kernel._capturing(t.index)
    try:
        kern = _kernel_for(t, plan, capturing)
        stream = _kernel.raw_stream(t.index)
        counter = None if kern is None else _counter(t, x.device, stream, capturing)
        if kern is None or counter is None:
            _not_ready(t, m, n, k, "its kernel is not loaded" if kern is None else "its counter workspace is not allocated")
            return None
        flags = selection_flags(renormalize, scoring)
        vkey = (id(plan), flags, bias is not None)
        if _verified.get(vkey) is not plan:  # verification on first use (ops._verify): once per instance and selection
            if not _verified_here(t, plan, kern, counter, stream, (m, n, k, n_group, topk_group, top_k, flags, float(scaling)),
                                  bias is not None, capturing):
                return None
            _verified[vkey] = plan
        ids = x.new_empty((m, top_k), dtype=_torch.int64)
        weights = x.new_empty((m, top_k), dtype=_torch.float32)
        logits = x.new_empty((m, n), dtype=_torch.float32)
        kern.launch(plan, stream, (
            ids.data_ptr(), weights.data_ptr(), logits.data_ptr(), counter, x.data_ptr(), w.data_ptr(),
            0 if bias is None else bias.data_ptr(), m, n, k, n_group, topk_group, top_k, flags, float(scaling),
        ))
    except (kernels.CompileForbiddenError, NotWarmedError) as exc:
        if isinstance(exc, NotWarmedError):
            raise
        raise kernels.CompileForbiddenError(f"moe_gate (M={m}, N={n}, K={k}) on cuda:{t.index}: {exc}") from None
    except Exception as exc:
        err = exc if isinstance(exc, KernelError) else KernelError(f"launching the moe_gate kernel: {type(exc).__name__}: {exc}")
        if t.strict:
            if err is exc:
                raise
            raise err from exc
        _fail(t, str(err))
        return None
    return ids, weights


def verification_states(prof: Profile, m: int, n: int, k: int) -> list[str]:
    """The verification state of the instance the served router of (N, K) takes at M (``explain moe_gate --shape``), in
    :func:`hwprofile.ops._verify.state`'s words: verified, failed, not yet, or off and by whom."""
    from . import _verify

    if OP not in prof.kernels:
        return []
    r = MOE_GATE.router_for(n, k)
    launch_plan, _ = plan(prof, m, n, k, r.n_group, r.topk_group, r.top_k, bool(prof["gemv.split_k"]))
    if launch_plan is None:
        return []
    flags = selection_flags(r.renormalize, r.scoring)
    state = _verify.state(prof, OP, launch_plan, (m, n, k), _selection_code(r.n_group, r.topk_group, r.top_k, flags))
    return [f"{state} (the selection of {r.name}: top_k={r.top_k}, n_group={r.n_group}, topk_group={r.topk_group})"]


def _selection_code(n_group: int, topk_group: int, top_k: int, flags: int) -> int:
    """The selection an instance was verified with, as the verdict's ``scale`` field (flags, top_k, groups)."""
    return flags | (top_k << 8) | (topk_group << 16) | (n_group << 24)


def _verified_here(t: _dispatch._Table, plan: Launch, kern: Any, counter: int, stream: int, args: tuple[Any, ...], with_bias: bool,
                   capturing: bool) -> bool:
    """Verification on first use of one fused-gate instance (:mod:`hwprofile.ops._verify`): True if it may serve calls.

    A verdict of this device whose stamp matches is reused; inside a capture none is :class:`NotVerifiedError`;
    else the instance runs on seeded inputs (and on inputs with exactly tied experts) and is compared with float64
    logits and the torch selection of its own logits (:func:`check_instance`). A failure disables the kernel here
    (one warning; strict mode raises)."""
    from .. import _verdicts
    from ..errors import NotVerifiedError
    from . import _verify

    if not _verify.enabled(t.prof):
        return True
    m, n, k, n_group, topk_group, top_k, flags, scaling = args
    code = _selection_code(n_group, topk_group, top_k, flags)
    v = _verify.lookup(t.prof, OP, plan, (m, n, k), code)
    if v is None:
        if capturing:
            raise NotVerifiedError(
                f"moe_gate (M={m}, N={n}, K={k}, n_group={n_group}, topk_group={topk_group}, top_k={top_k}) was first called inside "
                f"a CUDA-graph capture on cuda:{t.index}, and its kernel instance {plan.name_expression} has no verdict on this device: "
                f"call hwprofile.ops.warmup(device={t.index}, shapes={{'moe_gate': [({m}, {n}, {k})]}}) (or the op once) before capturing"
            )

        def run(ids: Any, weights: Any, logits: Any, x: Any, w: Any, b: Any) -> None:
            kern.launch(plan, stream, (ids.data_ptr(), weights.data_ptr(), logits.data_ptr(), counter, x.data_ptr(), w.data_ptr(),
                                       0 if b is None else b.data_ptr(), m, n, k, n_group, topk_group, top_k, flags, scaling))

        def check() -> Any:
            res = check_instance(run, x_device=t.index, m=m, n=n, k=k, n_group=n_group, topk_group=topk_group, top_k=top_k,
                                 flags=flags, scaling=scaling, with_bias=with_bias)
            return _verify.verdict(t, OP, plan, (m, n, k), code, res)

        v = _verify.fleet_once(t.prof, _verdicts.stamp(t.prof, OP, plan, (m, n, k), code), check)
    if v.ok:
        return True
    why = f"its instance {v.instance} at M, N, K = {v.shape} failed verification against float64 ({v.where}, {v.date}): {v.error}"
    if t.strict:
        raise KernelError(f"moe_gate on cuda:{t.index} ({t.prof.device.name}): {why}")
    _fail(t, why)
    return False


def check_instance(run: Callable[..., None], *, x_device: int, m: int, n: int, k: int, n_group: int, topk_group: int, top_k: int,
                   flags: int, scaling: float, with_bias: bool) -> Any:
    """Run a fused-gate instance (``run(ids, weights, logits, x, w, bias)``) on two seeded input sets, the second with
    exactly tied experts (duplicated weight rows), and compare: logits with float64 (row error 1e-4), ids equal to the torch
    selection of the kernel's own logits (ties to the lower index), weights with that selection's (1e-5)."""
    from . import _verify

    torch = _torch
    dev = torch.device("cpu") if x_device < 0 else torch.device("cuda", x_device)
    gen = torch.Generator(device=dev).manual_seed(4321 + 7 * m + 13 * n + k)
    scoring = "softmax" if flags & SOFTMAX else "sigmoid"
    worst = 0.0
    for name in ("random", "ties"):
        x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
        w = torch.randn(n, k, device=dev, generator=gen).to(torch.bfloat16)
        if name == "ties":
            w[1::2] = w[0::2][: n // 2]  # experts 2i and 2i+1 score exactly alike: the lower index must win
        b = (torch.randn(n, device=dev, generator=gen) * 0.1) if with_bias else None
        if b is not None and name == "ties":
            b[1::2] = b[0::2][: n // 2]
        ids = torch.full((m, top_k), -1, dtype=torch.int64, device=dev)
        weights = torch.full((m, top_k), float("nan"), dtype=torch.float32, device=dev)
        logits = torch.full((m, n), float("nan"), dtype=torch.float32, device=dev)
        run(ids, weights, logits, x, w, b)
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()
        ref = x.double() @ w.double().t()
        if not bool(torch.isfinite(logits).all()):
            return _verify.Outcome(False, None, f"{name} inputs: the logits have NaN or Inf (an element never written)")
        err = float(((logits.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-300)).max())
        if err > 1e-4:
            return _verify.Outcome(False, err, f"{name} inputs: logits relative error {err:.3g} above 0.0001 against float64")
        rid, rw = select_torch(logits, b, n_group, topk_group, top_k, bool(flags & RENORM), scaling, scoring)
        if not torch.equal(ids, rid):
            row = int((ids != rid).any(dim=1).nonzero()[0, 0])
            return _verify.Outcome(False, err, f"{name} inputs: ids of token {row} {ids[row].tolist()} differ from the torch selection "
                                               f"{rid[row].tolist()} on the kernel's own logits")
        werr = float((weights.double() - rw.double()).norm() / rw.double().norm().clamp_min(1e-300))
        if not werr <= 1e-5:
            return _verify.Outcome(False, werr, f"{name} inputs: weights relative error {werr:.3g} above 1e-05")
        worst = max(worst, err, werr)
    return _verify.Outcome(True, worst)


def run_kernel(x: Any, w: Any, bias: Any, *, top_k: int, n_group: int, topk_group: int, renormalize: bool, scaling: float,
               scoring: str) -> tuple[Any, Any]:
    """The fused kernel on 2-D CUDA operands whatever the route says: what ``hwprofile sweep moe_gate`` times (the gate's
    ``ops.run_kernel``). A ``ValueError`` names what the plugin's planner refuses (or a missing kernel); a fault is a
    ``KernelError``, never the torch path in disguise."""
    n, k = check(x, w, bias, top_k, n_group, topk_group, scoring)
    if x.dim() != 2 or not x.is_cuda:
        raise ValueError(f"moe_gate run_kernel: hidden must be a 2-D CUDA tensor, got {tuple(x.shape)} on {x.device}")
    if _misplaced(x, w, bias):
        raise ValueError("moe_gate run_kernel: an operand is not contiguous or not 16-byte aligned")
    t = _dispatch.table(x.get_device())
    if OP not in t.prof.kernels:
        raise ValueError(f"moe_gate run_kernel: {_route_of(t).who} provides no moe_gate kernel on cuda:{t.index}")
    m = x.shape[0]
    launch_plan, why = plan(t.prof, m, n, k, n_group, topk_group, top_k, t.split_k)
    if launch_plan is None:
        raise ValueError(f"moe_gate run_kernel: M={m}, N={n}, K={k}: {why}")
    got = launch(t, launch_plan, x, w, bias, m, n, k, n_group, topk_group, top_k, renormalize, scaling, scoring)
    if got is None:
        raise KernelError(f"moe_gate run_kernel on cuda:{t.index}: {failed.get(t.index) or 'the kernel is not ready in this capture'}")
    return got


def warm(t: _dispatch._Table, device: Any, shapes: list[tuple[int, int, int]]) -> tuple[int, list[str]]:
    """Load and verify the fused kernel for every shape the route sends to it (with the served router's selection: a capture
    after warm-up finds the verdict), allocate the workspace: (instances ready, failures)."""
    ready, failures = 0, []
    for m, n, k in shapes:
        router = MOE_GATE.router_for(n, k)
        gate, plan_, _ = route_gate(t, m, n, k, router.n_group, router.topk_group, router.top_k)
        if gate is not None:
            continue
        try:
            kern, stream = _kernel_for(t, plan_, False), _kernel.raw_stream(t.index)
            counter = _counter(t, device, stream, False)
            # verified here, as a first eager call with the served router's selection would be: a capture after warm-up finds the
            # verdict (it does not depend on the bias, which the check includes where the router's scoring takes one)
            args = (m, n, k, router.n_group, router.topk_group, router.top_k, selection_flags(router.renormalize, router.scoring),
                    float(router.scaling))
            if counter is None:
                failures.append(f"moe_gate M={m} N={n} K={k} (its counter workspace is not allocated)")
                continue
            if not _verified_here(t, plan_, kern, counter, stream, args, router.scoring == "sigmoid", False):
                failures.append(f"moe_gate M={m} N={n} K={k} (failed verification)")
                continue
            ready += 1
        except Exception as exc:  # as launch() does: a torch or driver fault while verifying is this instance's failure
            err = exc if isinstance(exc, KernelError) else KernelError(f"warming the moe_gate kernel: {type(exc).__name__}: {exc}")
            if t.strict:
                if err is exc:
                    raise
                raise err from exc
            _fail(t, str(err))
            failures.append(f"moe_gate M={m} N={n} K={k}")
    return ready, failures
