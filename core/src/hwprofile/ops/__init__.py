"""Ops: each a plain function over one contract, routed to its plugin kernel or its torch fallback. Never imports torch at import.

Contracts (every path, kernel or fallback, returns exactly this; facts from ``hwprofile.optable``):

==================  ====================================================  =========================
op                  inputs                                                output
==================  ====================================================  =========================
router_gemm         hidden [..., K] bf16, weight [N, K] bf16              [..., N] **float32**
linear_bf16_fp32    x [..., K] bf16, w [N, K] bf16                        [..., N] **float32**
gemv                x [..., K] bf16, w [N, K] bf16                        [..., N] bf16 (fp32 acc.)
fp8_gemv            x [..., K] bf16, w [N, K] float8_e4m3fn, scale fp32   [..., N] bf16 (fp32 acc.)
                    ([] / [1] per tensor, or [N] per output row)
==================  ====================================================  =========================

Every op takes ``out=`` (a preallocated result of exactly that shape and dtype, written and
returned; one that overlaps an input is computed through a temporary, one whose elements overlap
is a ValueError), any leading batch dimensions, empty dimensions (M = 0 or N = 0 give an empty result,
K = 0 gives zeros) and strided, expanded or overlapping inputs (the fallback takes what is not
contiguous). Gradients: the formula ``OpDef.backward`` names (``_fallbacks.BACKWARDS``; the four GEMM
ops: ``x . (w * scale)^T``'s in fp32 accumulation, ``_library``) whichever path ran the forward;
fp8_gemv has one for ``x`` only and refuses a ``w`` or ``scale`` that requires grad (``OpDef.grads``);
an op declaring ``backward=None`` refuses every operand that requires grad, naming the op. Under
``torch.compile`` with static shapes the route is decided while tracing (a fallback route is plain
torch in the graph); see ``_dispatch._compiled``.

:func:`moe_gate` (the MoE gate step) is the op table's entry of its second contract kind
(``optable.GATES``, a :class:`~hwprofile.optable.GateDef`): a GEMM box like the GEMM ops' (its own
``moe_gate.*`` settings), two outputs and the selection's arguments; ``_gate`` routes it to the
plugin's fused kernel (one launch: GEMM and selection) or to its torch fallback
(docs/architecture.md, "The gate kind: ops.moe_gate").

The package, one concern a module:

* ``_dispatch``: :func:`route` (the only place that decides kernel or fallback), the per-device
  tables and route memos, :func:`decide`, and the eager entry every op calls;
* ``_fallbacks``: the fallback registry, keyed by the op table, and the gradient formulas ``OpDef.backward`` names;
* ``_pieces``: what an op of the table lacks (the import-time check below);
* ``_kernel``: operand checks, loading and launching a kernel (never routes);
* ``_gate``: moe_gate: its route (:func:`decide_moe_gate`), torch path, custom op, the fused kernel's launch and faults;
* ``_library``: ``torch.ops.hwprofile.<op>`` for ``torch.compile``;
* ``_warmup``: :func:`warmup`, which makes first calls of given shapes safe inside a CUDA-graph capture.

Adding an op: one ``OpDef`` in ``hwprofile.optable.OPS`` (declaring its backward and its kernel family), one
entry in ``_fallbacks.FALLBACKS`` (and in ``_fallbacks.BACKWARDS`` if its gradient formula is new), one short
public function below named as the op, and a kernel in a plugin; ``__all__`` and the lazy binding follow
from the table. Importing this module raises one error naming every missing piece of every op
(:func:`_pieces.missing_pieces`), and tests/ops/ runs its contract suite over the table
(tests/ops/test_new_op.py adds a fifth op that way, in a copy of the package).

Why the public functions are reached through ``__getattr__`` (PEP 562) until torch is bound:
1. binding needs torch, and importing this module must not import it (``decide()`` and
   :func:`route` work without torch);
2. an op's first call may come inside ``torch.compile``: dynamo would trace a call of
   :func:`register` and cannot, but it performs attribute lookups for real, so the first
   ``ops.router_gemm`` lookup binds, defines the custom ops and puts the functions here; later
   lookups are plain (tests/ops/test_compile.py holds both orders of import).
If torch is already imported, binding happens at import.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import HwprofileError, NotVerifiedError, NotWarmedError
from ..optable import NO_SCALE, OPS, ROW_SCALE, TABLE, TENSOR_SCALE
from . import _dispatch, _gate, _kernel, _library, _verify
from ._dispatch import ENTRIES, Decision, decide, reset_dispatch, route
from ._fallbacks import BACKWARDS, FALLBACKS
from ._gate import decide as decide_moe_gate
from ._pieces import missing_pieces
from ._warmup import WarmupReport, warmup

if TYPE_CHECKING:
    import torch

__all__ = [
    "NO_SCALE", "ROW_SCALE", "TENSOR_SCALE", "Decision", "NotVerifiedError", "NotWarmedError", "WarmupReport", "decide",
    "decide_moe_gate", "fallback", "register", "reset_dispatch", "route", "run_kernel", "warmup",
]
__all__ += list(TABLE)  # the public ops, one per op of the table (each defined below under the op's name)

_call = _dispatch.call


# --- the public ops: one short function per op of the op table, named as the op ----------------------


def router_gemm(hidden: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """MoE router logits: ``hidden[..., K] bf16 . weight[N, K]^T -> [..., N] float32`` on every path."""
    return _call(ENTRIES["router_gemm"], hidden, weight, None, out)  # type: ignore[no-any-return]


def linear_bf16_fp32(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[..., K] bf16 . w[N, K]^T -> [..., N] float32``; small M may use the plugin kernel."""
    return _call(ENTRIES["linear_bf16_fp32"], x, w, None, out)  # type: ignore[no-any-return]


def gemv(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode GEMV: ``x[..., K] bf16 . w[N, K]^T -> [..., N] bf16`` with fp32 accumulation (kernel at M = 1)."""
    return _call(ENTRIES["gemv"], x, w, None, out)  # type: ignore[no-any-return]


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[..., K] bf16 . (w[N, K] e4m3 * scale)^T -> [..., N] bf16``; scale per tensor ([] or [1]) or per row ([N])."""
    return _call(ENTRIES["fp8_gemv"], x, w, scale, out)  # type: ignore[no-any-return]


def moe_gate(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, top_k: int, n_group: int = 1,
    topk_group: int = 1, renormalize: bool = True, routed_scaling_factor: float = 1.0, scoring: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE gate step: ``(topk_ids int64, topk_weights float32)``, each ``[..., top_k]``.

    ``hidden [..., K]`` bf16 and ``weight [N, K]`` bf16 give fp32 router logits, then the selection:
    scores = sigmoid(logits) (``scoring="softmax"``: softmax over the N experts), the correction
    ``bias`` ([N] float32, ``e_score_correction_bias``; None: none) added for the choice, ``n_group``
    groups scored by the sum of their top-2 (softmax: their largest), the ``topk_group`` best kept,
    the ``top_k`` best experts; weights = unbiased scores, normalised if ``renormalize``
    (``norm_topk_prob``), times ``routed_scaling_factor``. Ties go to the lower index; ids in
    descending order of biased score. DeepSeek-V3: N=256, n_group=8, topk_group=4, top_k=8, scaling
    2.5; Kimi-K2: N=384, top_k=8, scaling 2.827; Qwen3 MoE: N=128, top_k=8, scoring="softmax".

    One launch where :func:`decide_moe_gate` says so (the plugin's fused kernel: GEMM and selection;
    sm90: M <= 16, N <= 512, top_k <= 32, n_group <= 32, inside the ``moe_gate.*`` box), else the
    torch path (``torch.mm(out_dtype=float32)`` and the same selection in torch; also for CPU
    tensors). Under ``torch.compile`` the route is decided while tracing. Gradients:
    ``topk_weights`` is differentiable in ``hidden`` and ``weight`` (router_gemm's backward and torch's
    for the selection); ids and ``bias`` carry none (``bias`` is refused if it requires grad). A
    kernel fault warns once and takes the torch path from then on.
    """
    return _gate.call(hidden, weight, bias, top_k, n_group, topk_group, renormalize, routed_scaling_factor, scoring)


def _entry(op: str) -> _dispatch._Entry:
    e = ENTRIES.get(op)
    if e is None:
        raise KeyError(f"no op {op!r} in hwprofile's op table; known ops: {', '.join(OPS)}")
    return e


def fallback(op: str) -> Callable[..., Any]:
    """``op``'s torch fallback on 2-D contract operands (``fallback(op)(x, w[, scale])``): what the op runs off its kernel.

    The same function the ops dispatch to and ``hwprofile sweep`` times against the kernel.
    """
    _entry(op)
    register()
    return FALLBACKS[op]


def run_kernel(op: str, out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, *,
               split_k: bool | None = None) -> bool:
    """Launch ``op``'s plugin kernel on 2-D contract operands of one CUDA device, without routing.

    For sweeps, benchmarks and kernel tests, which must run the kernel also outside the region
    dispatch sends to it. Every operand is checked (a ValueError names the argument); ``split_k``
    None takes the profile's ``gemv.split_k``. Returns False, after one warning, when the kernel
    cannot be built, loaded or launched on this device, or failed here before (``HWPROFILE_STRICT=1``:
    the error is raised).
    """
    _entry(op)
    register()
    idx = _kernel.device_index(x, _dispatch._cpu_index) if hasattr(x, "get_device") else -1
    if idx < 0:
        raise ValueError(f"{op}: run_kernel needs CUDA tensors, got x on {getattr(x, 'device', type(x).__name__)}")
    m, n, k, mode = _kernel.check_operands(op, idx, _dispatch._cpu_index, out, x, w, scale)
    t = _dispatch.table(idx)
    if op not in t.prof.kernels:
        who = f"{t.prof.plugin.name} provides no kernel" if t.prof.plugin else "no architecture plugin serves the device, so no kernel"
        raise HwprofileError(f"{op}: {who} on cuda:{idx}")
    return _kernel.launch(t, op, out, x, w, scale, m, n, k, mode, split_k)


#: The hook asked when a device's dispatch table is built (hwprofile.hookspecs): the tools that run kernels
#: through this package (hwprofile.selftest) sit above it, so they are reached as plugins, never imported here.
CHECK_KERNELS_HOOK = "hwprofile_check_kernels"


def _check_kernels(t: _dispatch._Table) -> None:
    """Ask the plugins which of the new table's kernels must not run (core's answer: the opt-in ``HWPROFILE_SELFTEST=1``)."""
    if not t.prof.kernels:
        return
    from ..errors import PluginError
    from ..profiles import registry

    reg = registry()
    for p, out in reg.call_layers(CHECK_KERNELS_HOOK, reg.participants(t.prof.plugin, CHECK_KERNELS_HOOK), profile=t.prof):
        if out is None:
            continue
        if not isinstance(out, Mapping) or not all(op in OPS and isinstance(why, str) for op, why in out.items()):
            raise PluginError(f"plugin {p.label}: {CHECK_KERNELS_HOOK} must return None or {{op: reason}} for ops of the "
                              f"op table ({', '.join(OPS)}), got {out!r:.120}")
        _disable_kernels(t, out)


def _disable_kernels(t: _dispatch._Table, reasons: Mapping[str, str], stacklevel: int = 4) -> None:
    """Send each op of ``reasons`` to its fallback on ``t``'s device, one warning each (strict mode: raise instead)."""
    from ..errors import KernelError

    for op, why in reasons.items():
        if t.errors.get(op):  # already failed here (a launch error warned): no second warning
            continue
        if t.strict:
            raise KernelError(f"{op} on cuda:{t.index} ({t.prof.device.name}): {why}")
        t.fail(op, why)
        warnings.warn(f"hwprofile: {op} kernel disabled on cuda:{t.index} ({t.prof.device.name}): {why}; using the torch fallback",
                      RuntimeWarning, stacklevel=stacklevel)


_dispatch.on_new_table.append(_verify.check_deferred_plans)  # before any kernel of the table runs: what profile() could not check
_dispatch.on_new_table.append(_check_kernels)


# The public functions, hidden until register() binds torch (the module docstring says why): one per op of the
# table, taken out of the module's namespace (``__getattr__`` puts them back); an op without one is a missing piece.
_PUBLIC: dict[str, Callable[..., Any]] = {name: globals().pop(name) for name in TABLE if callable(globals().get(name))}

_missing = missing_pieces(OPS, FALLBACKS, BACKWARDS, _PUBLIC)
if _missing:  # refuse to import rather than route an op to nothing (or to another op's fallback or backward)
    raise HwprofileError(
        f"hwprofile.ops: the op table is incomplete ({len(_missing)} missing piece(s); docs/architecture.md, 'Adding an op'): "
        + "; ".join(_missing)
    )


def register() -> None:
    """Bind torch, define ``torch.ops.hwprofile.<op>`` for every op and expose the public ops here (idempotent; imports torch)."""
    if not _library.registered():
        _library.register()
    globals().update(_PUBLIC)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hwprofile.ops' has no attribute {name!r}")
    register()
    return globals()[name]


if "torch" in sys.modules:  # torch is already paid for: register now
    register()
