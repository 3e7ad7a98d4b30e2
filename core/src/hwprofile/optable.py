"""The op table: every op declared once. It must never import torch or CUDA (profiles read it).

One :class:`OpDef` per op holds every fact about the op that more than one module needs: its
contract (argument names, dtypes, output dtype), the settings that gate its kernel (declared here,
turned into :class:`~hwprofile.settings.Setting` objects by ``settings.py``), the dispatch bounds
(the kernel's limits, constants or setting keys), the settings of its cost model and per-shape
decisions (``<op>.model``, ``<op>.measured``), the identity string of its fallback that tuning
stamps record, the default sweep grid and the op's shape family.

Every consumer iterates :data:`OPS` rather than keeping its own list: ``hwprofile.ops`` builds one
run-time entry per op and refuses to import when one lacks a fallback (``ops._fallbacks.FALLBACKS``,
keyed by this table) or a public function; ``decide()`` explains with it, ``sweep`` measures and
writes with it, ``tuning`` stamps its fallback identity, ``kernels.skinny_gemm`` reads its dtypes
and scale modes, the CLI lists it, and tests/ops/ runs its contract suite over it. Adding an op:
the recipe in :mod:`hwprofile.ops`' docstring.
"""

from __future__ import annotations

from typing import Final, final

from ._record import Record

# fp8_gemv scale modes (the kernels' ``SCALE`` template argument): none, one per tensor, one per row
NO_SCALE: Final = 0
TENSOR_SCALE: Final = 1
ROW_SCALE: Final = 2

#: the shared skinny-GEMM kernel family (``OpDef.family``): ``x . (w * scale)^T`` rounded to the output dtype, one
#: kernel body per SM (``include/hwprofile/gemv.cuh``) planned by ``hwprofile.kernels.skinny_gemm``
SKINNY_GEMM: Final = "skinny_gemm"
FAMILIES: Final = (SKINNY_GEMM,)
#: ``OpDef.backward`` of an op that is ``x . (w * scale)^T``: ``hwprofile.ops._fallbacks.gemm_backward``
GEMM_BACKWARD: Final = "gemm"

Bound = int | str  # a constant, or the key of an int setting read from the profile
SettingDecl = tuple[str, str, object, str, bool, float | None, float | None]  # Setting(key, type, default, doc, bit_identical, min, max)


@final
class OpDef:
    """One op: contract, gates, fallback, sweep. Read-only by convention; built once at import."""

    __slots__ = (
        "args",
        "backward",
        "doc",
        "fallback",
        "family",
        "grads",
        "grid",
        "k_multiple",
        "k_vec",
        "layer",
        "max_k",
        "max_m",
        "max_n",
        "min_k",
        "min_n",
        "n_multiple",
        "name",
        "out_dtype",
        "prebuilt",
        "roof",
        "scale_modes",
        "settings",
        "threshold",
        "w_dtype",
        "x_dtype",
    )

    kind: Final = "gemm"  #: the contract kind (:data:`GEMM_KIND`; gates are :class:`GateDef`)
    name: str  #: op name: ``hwprofile.ops.<name>``, ``torch.ops.hwprofile.<name>``, kernel spec ``op``, settings prefix
    doc: str  #: one line: what it computes
    args: tuple[str, ...]  #: public argument names, in order (the last is the scale for scaled ops)
    x_dtype: str  #: torch dtype name of the activation ``[..., K]``
    w_dtype: str  #: torch dtype name of the weight ``[N, K]``
    out_dtype: str  #: torch dtype name of the result ``[..., N]``, on every path
    scale_modes: tuple[int, ...]  #: kernel scale modes (``(NO_SCALE,)`` for unscaled ops)
    k_vec: int  #: K elements per 16-byte load of the weight: the kernels need K % k_vec == 0
    fallback: str  #: identity of the fallback tuning stamps record; the function is ``hwprofile.ops._fallbacks.FALLBACKS[name]``
    max_m: Bound  #: largest M (rows of x after flattening the leading dims) the kernel takes
    min_n: Bound  #: smallest N the kernel is dispatched for
    max_n: Bound  #: largest N
    n_multiple: Bound  #: N must be a multiple of this
    min_k: Bound  #: smallest K
    max_k: Bound  #: largest K
    k_multiple: Bound  #: K must be a multiple of this (and of ``k_vec``)
    roof: tuple[Bound, Bound] | None  #: [lo, hi) range of N left to the fallback (near the bandwidth roof)
    threshold: str  #: what a sweep chooses: "max_tokens" (a prefix in M) or "box" (an N x K box at M = 1)
    grid: tuple[tuple[int, int, int], ...]  #: default sweep grid (M, N, K), and the grid a stamp's launch-plan digest covers
    settings: tuple[SettingDecl, ...]  #: the op's settings, declared here once
    #: the (M, N, K) shapes whose kernel instances ``hwprofile compile`` pre-builds (other shapes compile on first use)
    #: and the self-test checks; nothing else (family membership is :attr:`family`)
    prebuilt: tuple[tuple[int, int, int], ...]
    #: the shared kernel family that computes the op on every architecture plugin built on it (:data:`SKINNY_GEMM`:
    #: ``x . (w * scale)^T`` rounded to ``out_dtype``, planned by ``hwprofile.kernels.skinny_gemm``), or None: the op's
    #: kernel is a plugin's own. Declared, never inferred: a family member gets the family's plain GEMM on every such
    #: plugin, so an op with any other math (an epilogue) must say None
    family: str | None
    #: the op's gradient formula, by name in ``hwprofile.ops._fallbacks.BACKWARDS`` (:data:`GEMM_BACKWARD`: the gradients
    #: of ``x . (w * scale)^T`` in fp32 accumulation), or None: the op has no backward, and a call with an operand that
    #: requires grad (grad mode on) is refused with an error naming the op. Declared, never inferred
    backward: str | None
    #: which layers of a served model feed the op (``hwprofile.models``, what a catalog sweep and ``warmup(models=)``
    #: take): "router" (the MoE router at the decode batch sizes), "projection" (every weight at M = 1; an FP8-weight op
    #: only where the model is served in FP8), or None (no served layer: its sweep grid only)
    layer: str | None
    #: the arguments that get gradients (through :attr:`backward`; default the first two when it is set, none when it is
    #: None); an argument not named here that requires grad in grad mode is refused with an error naming the op and argument
    grads: tuple[str, ...]

    def __init__(
        self, name: str, doc: str, *, args: tuple[str, ...], w_dtype: str, out_dtype: str, fallback: str,
        max_m: Bound, min_n: Bound, max_n: Bound, min_k: Bound, max_k: Bound, threshold: str, grid: tuple[tuple[int, int, int], ...],
        settings: tuple[SettingDecl, ...], family: str | None, backward: str | None,
        n_multiple: Bound = 1, k_multiple: Bound = 1, roof: tuple[Bound, Bound] | None = None,
        x_dtype: str = "bfloat16", scale_modes: tuple[int, ...] = (NO_SCALE,), grads: tuple[str, ...] | None = None,
        prebuilt: tuple[tuple[int, int, int], ...] = (), layer: str | None = None,
    ) -> None:
        self.name, self.doc, self.args = name, doc, args
        self.x_dtype, self.w_dtype, self.out_dtype, self.scale_modes = x_dtype, w_dtype, out_dtype, scale_modes
        self.k_vec = 16 if w_dtype.startswith("float8") else 8
        self.fallback = fallback
        self.max_m, self.min_n, self.max_n, self.n_multiple = max_m, min_n, max_n, n_multiple
        self.min_k, self.max_k, self.k_multiple, self.roof = min_k, max_k, k_multiple, roof
        if threshold not in ("max_tokens", "box"):
            raise ValueError(f"op {name}: threshold kind {threshold!r} is not 'max_tokens' or 'box'")
        self.threshold, self.grid, self.settings, self.prebuilt = threshold, grid, settings, prebuilt
        if layer not in (None, "router", "projection"):
            raise ValueError(f"op {name}: layer {layer!r} is not 'router', 'projection' or None")
        self.layer = layer
        if family not in (None, *FAMILIES):
            raise ValueError(f"op {name}: family {family!r} is not one of {FAMILIES} or None (an op with a kernel of its own)")
        self.family, self.backward = family, backward
        if backward is None and grads:
            raise ValueError(f"op {name}: grads {grads} given, but backward is None (the op has no gradient formula)")
        self.grads = (args[:2] if backward is not None else ()) if grads is None else grads
        if not set(self.grads) <= set(args):
            raise ValueError(f"op {name}: grads {self.grads} names an argument not in {args}")
        declared = {s[0] for s in settings}
        for b in (max_m, min_n, max_n, n_multiple, min_k, max_k, k_multiple, *(roof or ())):
            if isinstance(b, str) and b not in declared:
                raise ValueError(f"op {name}: bound {b!r} names a setting the op does not declare")

    @property
    def scaled(self) -> bool:
        """True when the op takes a scale tensor (FP8 weights)."""
        return self.scale_modes != (NO_SCALE,)

    @property
    def kernel_out(self) -> str:
        """The kernels' output type name: ``"float"`` or ``"bf16"``."""
        return "float" if self.out_dtype == "float32" else "bf16"

    def bound_keys(self) -> tuple[str, ...]:
        """The setting keys that bound the kernel's region (what a sweep writes and a stamp covers)."""
        bounds = (self.max_m, self.min_n, self.max_n, self.n_multiple, self.min_k, self.max_k, self.k_multiple, *(self.roof or ()))
        return tuple(b for b in bounds if isinstance(b, str))

    def __repr__(self) -> str:
        return f"OpDef({self.name!r})"


def _int(key: str, default: int, doc: str, lo: int = 0, hi: int = 1 << 24, bit_identical: bool = True) -> SettingDecl:
    return (key, "int", default, doc, bit_identical, lo, hi)


def _kernel_limits(op: str, what: str, *, min_n: int, min_k: int, max_n: int = 262144) -> tuple[SettingDecl, ...]:
    """What a kernel of the skinny-GEMM family takes: the only box dispatch keeps (inside it, measured shapes
    and the cost model decide; the plan gate refuses what a target's limits cannot launch). The kernels stream
    x through shared memory in chunks, so K is bounded by what is served, not by shared memory: twice the
    catalog's longest K (32768), and N past its widest LM head (202048)."""
    return (
        _int(f"{op}.min_k", min_k, f"smallest K the {what} takes", 1, 1 << 20),
        _int(f"{op}.max_k", 65536, f"largest K the {what} takes (x streamed through shared memory in chunks)", 1, 1 << 20),
        _int(f"{op}.min_n", min_n, f"smallest N the {what} takes", 1),
        _int(f"{op}.max_n", max_n, f"largest N the {what} takes", 1, max_n if max_n < 262144 else 1 << 24),
    )


def _gemv_settings(op: str, what: str, vec: int) -> tuple[SettingDecl, ...]:
    """A GEMV kernel's limits: any K of whole 16-byte loads (``vec`` weight elements: K = 2880 is 180 of 16;
    small K is served: the 2026-12-02 H200 catalog has fp8_gemv 1x5120x192, where the kernel took 3.63 µs,
    benchmarks/RESULTS.md), N from 64 in multiples of 8; and an optional N range left to the fallback (off:
    the cost model decides)."""
    return (
        *_kernel_limits(op, what, min_n=64, min_k=vec),
        _int(f"{op}.k_multiple", vec, f"K must be a multiple of this for the {what} (its 16-byte loads)", 1, 1 << 16),
        _int(f"{op}.n_multiple", 8, f"N must be a multiple of this for the {what}", 1, 1 << 16),
        _int(f"{op}.cublas_roof_n_min", 0, f"from this N (inclusive) the {what} is never used, whatever the cost model says (0: no range)"),
        _int(f"{op}.cublas_roof_n_max", 0, "up to this N (exclusive) the fallback is always taken; equal to the min: no range"),
    )


def _measured(op: str) -> SettingDecl:
    """``<op>.measured``: the per-shape decisions of a sweep (format: ``hwprofile.tuning.MEASURED_FORMAT``).

    A str so that layers, stamps, staleness, ``explain`` and the cross-rank agreement cover it as
    any other setting; dispatch parses it once per device table (``tuning.parse_measured``).
    """
    return (
        f"{op}.measured",
        "str",
        "",
        f"per-shape decisions of a sweep of {op} (MxNxK=kernel|fallback:KERNEL_US/FALLBACK_US; '; '-separated): "
        f"the path taken at each measured shape; {op}.model predicts elsewhere, corrected by these times",
        True,
        None,
        None,
    )


def _model(op: str) -> SettingDecl:
    """``<op>.model``: the cost model's parameters (format: ``hwprofile.costmodel.MODEL_FORMAT``), fitted by a sweep.

    A str for the reasons ``<op>.measured`` is one; dispatch parses it once per device table. Empty:
    no model, so outside the measured shapes the fallback is taken (nothing predicts the kernel faster).
    """
    return (
        f"{op}.model",
        "str",
        "",
        f"cost model of {op}'s kernel and fallback over (M, N, K) (a launch + bytes/bandwidth trend per path, corrected by the "
        f"nearest {op}.measured shapes), fitted by 'hwprofile sweep {op}': the faster predicted path is taken at shapes "
        "nobody measured; empty: the fallback there",
        True,
        None,
        None,
    )


_ROUTER_GRID = tuple((m, n, 7168) for m in range(1, 17) for n in (256, 384))
_LINEAR_GRID = tuple((m, n, 7168) for m in range(1, 17) for n in (256, 4096))
_GEMV_GRID = tuple((1, n, k) for n in (2048, 4096, 7168, 12288, 16384, 28672) for k in (2048, 4096, 7168, 16384))
# FP8: wide N too (the old fallback dequantised the whole weight, so the kernel won everywhere)
_FP8_GRID = (
    *tuple((1, n, k) for n in (2048, 4096, 7168, 12288, 28672, 57344) for k in (2048, 4096, 7168)),
    (1, 152064, 5120),
    # M = 2..16 (the tensor-core kernel): the fewest, a middle and the most tokens of each M tile at the box's corners,
    # so no M the kernel takes lies outside what a sweep measured
    *tuple((m, n, k) for m in (2, 8, 9, 16) for n in (2048, 12288, 57344) for k in (2048, 7168)),
)

MM_FP32 = "torch.mm(out_dtype=torch.float32)"

#: Decode GEMVs (M = 1) pre-built: the projection shapes of common models (wider than the sweep grids), the
#: long-K down projections whose x is streamed in chunks (Llama-3.1-70B K = 28672 at N = 8192, Qwen3-32B
#: K = 25600 at N = 5120, a 32768-wide K at small N, which splits K) and the widest LM head of the model
#: catalog (Llama-4, vocab 202048); bf16 and FP8 weights alike.
GEMV_SHAPES: tuple[tuple[int, int, int], ...] = tuple(
    (1, n, k)
    for n, k in (
        (2048, 7168), (4096, 4096), (7168, 2048), (7168, 16384), (12288, 4096), (16384, 5120), (28672, 4096), (57344, 7168),
        (8192, 28672), (5120, 25600), (2048, 32768), (202048, 5120),
    )
)
#: Router GEMMs pre-built besides the router's grid: the model catalog's (N experts 8..512 at hidden sizes
#: 2048..7168: Mixtral, Llama-4, gpt-oss, Qwen3-MoE, GLM-4.5, DeepSeek-V3 / Kimi-K2), at the fewest and most tokens.
#: FP8 GEMVs pre-built: the decode GEMVs at M = 1 (SIMT kernel), and at M = 2 and 16 (the tensor-core kernel's two
#: M tiles: 8 and 16 tokens)
FP8_GEMV_SHAPES: tuple[tuple[int, int, int], ...] = (*GEMV_SHAPES, *((m, n, k) for m in (2, 16) for _, n, k in GEMV_SHAPES))
ROUTER_SHAPES: tuple[tuple[int, int, int], ...] = tuple(
    (m, n, k) for m in (1, 8, 16) for n in (8, 16, 32, 128, 160, 256, 384, 512) for k in (2048, 2880, 4096, 5120, 6144, 7168)
)

ROUTER_GEMM = OpDef(
    "router_gemm",
    "MoE router logits: hidden[..., K] bf16 . weight[N, K]^T -> [..., N] float32 on every path",
    args=("hidden", "weight"),
    w_dtype="bfloat16",
    out_dtype="float32",
    fallback=MM_FP32,
    max_m="router_gemm.max_tokens",
    min_n="router_gemm.min_n",
    max_n="router_gemm.max_n",
    min_k="router_gemm.min_k",
    max_k="router_gemm.max_k",
    threshold="max_tokens",
    grid=_ROUTER_GRID,
    prebuilt=tuple(dict.fromkeys((*_ROUTER_GRID, *ROUTER_SHAPES))),
    family=SKINNY_GEMM,
    backward=GEMM_BACKWARD,
    layer="router",
    settings=(
        _int(
            "router_gemm.max_tokens",
            16,
            "largest M the JIT router GEMM takes (the kernel's limit: M <= 16); inside it the cost model decides",
            0,
            16,
        ),
        *_kernel_limits("router_gemm", "JIT router GEMM", min_n=1, min_k=8),
        _measured("router_gemm"),
        _model("router_gemm"),
    ),
)
LINEAR_BF16_FP32 = OpDef(
    "linear_bf16_fp32",
    "small-M linear: x[..., K] bf16 . w[N, K]^T -> [..., N] float32 on every path",
    args=("x", "w"),
    w_dtype="bfloat16",
    out_dtype="float32",
    fallback=MM_FP32,
    max_m="linear_bf16_fp32.max_tokens",
    min_n="linear_bf16_fp32.min_n",
    max_n="linear_bf16_fp32.max_n",
    min_k="linear_bf16_fp32.min_k",
    max_k="linear_bf16_fp32.max_k",
    threshold="max_tokens",
    grid=_LINEAR_GRID,
    prebuilt=_LINEAR_GRID,
    family=SKINNY_GEMM,
    backward=GEMM_BACKWARD,
    layer="router",
    settings=(
        _int(
            "linear_bf16_fp32.max_tokens",
            0,
            "largest M for which linear_bf16_fp32 may use the plugin's small-M kernel (its limit is 16; 0: never); "
            "inside it the cost model decides",
            0,
            16,
        ),
        *_kernel_limits("linear_bf16_fp32", "small-M linear kernel", min_n=1, min_k=8),
        _measured("linear_bf16_fp32"),
        _model("linear_bf16_fp32"),
    ),
)
GEMV = OpDef(
    "gemv",
    "decode GEMV: x[..., K] bf16 . w[N, K]^T -> [..., N] bf16, fp32 accumulation; the kernel takes M = 1",
    args=("x", "w"),
    w_dtype="bfloat16",
    out_dtype="bfloat16",
    fallback="torch.nn.functional.linear",
    max_m=1,
    min_n="gemv.min_n",
    max_n="gemv.max_n",
    n_multiple="gemv.n_multiple",
    min_k="gemv.min_k",
    max_k="gemv.max_k",
    k_multiple="gemv.k_multiple",
    roof=("gemv.cublas_roof_n_min", "gemv.cublas_roof_n_max"),
    threshold="box",
    grid=_GEMV_GRID,
    prebuilt=GEMV_SHAPES,
    family=SKINNY_GEMM,
    backward=GEMM_BACKWARD,
    layer="projection",
    settings=(
        (
            "gemv.split_k",
            "bool",
            False,
            "let every op's kernel split K across a thread-block cluster where N alone leaves SMs idle: the router GEMM and "
            "small-M linear as well as the GEMVs (changes summation order)",
            False,
            None,
            None,
        ),
        *_gemv_settings("gemv", "bf16 GEMV kernel (M = 1)", 8),
        _measured("gemv"),
        _model("gemv"),
    ),
)
FP8_GEMV = OpDef(
    "fp8_gemv",
    "FP8 GEMV: x[..., K] bf16 . (w[N, K] e4m3 * scale)^T -> [..., N] bf16, scale per tensor ([] or [1]) or per row ([N]); "
    "the kernel takes M = 1..16",
    args=("x", "w", "scale"),
    w_dtype="float8_e4m3fn",
    out_dtype="bfloat16",
    scale_modes=(TENSOR_SCALE, ROW_SCALE),
    fallback=(
        "x split into 3 e4m3 parts + one torch._scaled_mm(out_dtype=torch.float32) from 4 MiB of weight (K, N % 16 == 0), "
        "else chunked exact bf16 dequantise + torch.mm(out_dtype=torch.float32); fp32 scale"
    ),
    max_m=16,  # M = 1: the SIMT kernel; M = 2..16: the tensor-core kernel (one weight read for every token)
    min_n="fp8_gemv.min_n",
    max_n="fp8_gemv.max_n",
    n_multiple="fp8_gemv.n_multiple",
    min_k="fp8_gemv.min_k",
    max_k="fp8_gemv.max_k",
    k_multiple="fp8_gemv.k_multiple",
    roof=("fp8_gemv.cublas_roof_n_min", "fp8_gemv.cublas_roof_n_max"),
    threshold="box",
    grid=_FP8_GRID,
    prebuilt=FP8_GEMV_SHAPES,
    family=SKINNY_GEMM,
    backward=GEMM_BACKWARD,
    layer="projection",
    grads=("x",),  # an e4m3 weight and its scale are quantised, frozen: a gradient for them is refused
    settings=(*_gemv_settings("fp8_gemv", "FP8 e4m3 GEMV kernel (M = 1..16)", 16), _measured("fp8_gemv"), _model("fp8_gemv")),
)

#: every op, by name, in the order the CLI and the docs list them
OPS: dict[str, OpDef] = {op.name: op for op in (ROUTER_GEMM, LINEAR_BF16_FP32, GEMV, FP8_GEMV)}

# --- the second contract kind: gates (a GEMM followed by a selection) ----------------------------

GEMM_KIND: Final = "gemm"  #: OpDef: ``x . w^T`` -> one tensor; ABI ``(out, x, w, scale, M, N, K)``
GATE_KIND: Final = "gate"  #: GateDef: router GEMM + expert selection -> ``(ids, weights)``; ABI of ``ops._gate.ARG_TYPES``


@final
class Router(Record):
    """One served router's selection settings: what a gate sweep and benchmark time at its (N, K)."""

    name: str
    n: int
    k: int
    top_k: int
    n_group: int = 1
    topk_group: int = 1
    renormalize: bool = True
    scaling: float = 1.0
    scoring: str = "sigmoid"

    def __repr__(self) -> str:
        return f"Router({self.name!r}, N={self.n}, K={self.k})"


@final
class GateDef:
    """A gate op: the router GEMM ``hidden[..., K] bf16 . weight[N, K]^T`` (fp32 logits) then a selection.

    Its dispatch bounds are those of a GEMM box (M, N, K; the same attribute names as :class:`OpDef`,
    so ``ops._dispatch`` resolves them alike), its outputs two tensors, its arguments the selection's
    on top. Consumers that are GEMM-specific iterate :data:`OPS`; those that cover every op
    (settings, stamps' owner, ``explain``) iterate :data:`TABLE`.
    """

    __slots__ = ("args", "doc", "fallback", "grads", "grid", "max_k", "max_m", "max_n", "min_k", "min_n", "name", "outputs",
                 "params", "routers", "scorings", "settings", "threshold")

    kind: Final = GATE_KIND
    x_dtype: Final = "bfloat16"
    w_dtype: Final = "bfloat16"
    logits_dtype: Final = "float32"  #: the GEMM's output on every path (what the selection reads)
    gemm: Final = "router_gemm"  #: the GEMM op whose custom op computes the logits off the kernel (its autograd formula)
    layer: Final = "router"  #: the served-model layer that feeds it (:attr:`OpDef.layer`): the gate's GEMM is the router's
    k_vec: Final = 8  #: 16-byte loads of bf16
    n_multiple: Final = 1
    k_multiple: Final = 1
    roof: Final = None
    scale_modes: Final = (NO_SCALE,)
    scaled: Final = False

    name: str
    doc: str
    args: tuple[str, ...]  #: tensor arguments, in order
    params: tuple[str, ...]  #: the selection's keyword arguments
    outputs: tuple[tuple[str, str], ...]  #: (name, torch dtype name) of each result
    scorings: tuple[str, ...]  #: accepted ``scoring`` values
    fallback: str  #: identity of the fallback tuning stamps record
    max_m: Bound
    min_n: Bound
    max_n: Bound
    min_k: Bound
    max_k: Bound
    threshold: str
    grid: tuple[tuple[int, int, int], ...]
    routers: tuple[Router, ...]  #: the served routers a sweep and the benchmark time (their N, K and selection)
    settings: tuple[SettingDecl, ...]
    grads: tuple[str, ...]

    def __init__(self, name: str, doc: str, *, args: tuple[str, ...], params: tuple[str, ...], outputs: tuple[tuple[str, str], ...],
                 scorings: tuple[str, ...], fallback: str, max_m: Bound, min_n: Bound, max_n: Bound, min_k: Bound, max_k: Bound,
                 routers: tuple[Router, ...], settings: tuple[SettingDecl, ...], grads: tuple[str, ...]) -> None:
        self.name, self.doc, self.args, self.params, self.outputs, self.scorings = name, doc, args, params, outputs, scorings
        self.fallback, self.max_m, self.min_n, self.max_n, self.min_k, self.max_k = fallback, max_m, min_n, max_n, min_k, max_k
        self.threshold, self.routers, self.settings, self.grads = "max_tokens", routers, settings, grads
        self.grid = tuple((m, r.n, r.k) for r in routers for m in range(1, 17))
        declared = {s[0] for s in settings}
        for b in (max_m, min_n, max_n, min_k, max_k):
            if isinstance(b, str) and b not in declared:
                raise ValueError(f"op {name}: bound {b!r} names a setting the op does not declare")

    def bound_keys(self) -> tuple[str, ...]:
        return tuple(b for b in (self.max_m, self.min_n, self.max_n, self.min_k, self.max_k) if isinstance(b, str))

    def router_for(self, n: int, k: int) -> Router:
        """The served router of (N, K), or a plain sigmoid top-min(8, N) one (what a sweep of another shape times)."""
        return next((r for r in self.routers if (r.n, r.k) == (n, k)), Router(f"N={n} K={k}", n, k, top_k=min(8, n)))

    def __repr__(self) -> str:
        return f"GateDef({self.name!r})"


#: the routers the gate's grid and benchmark cover (configs published with each model)
_ROUTERS = (
    Router("deepseek-v3", 256, 7168, top_k=8, n_group=8, topk_group=4, scaling=2.5),
    Router("kimi-k2", 384, 7168, top_k=8, scaling=2.827),
    Router("moonlight-16b", 64, 2048, top_k=6, scaling=2.446),  # DeepSeek-V3 rules, 64 experts, one group
    Router("qwen3-235b", 128, 4096, top_k=8, scoring="softmax"),
    Router("glm-4.5", 160, 5120, top_k=8, scaling=2.5),
    Router("qwen3-next-80b", 512, 2048, top_k=10, scoring="softmax"),
)

MOE_GATE = GateDef(
    "moe_gate",
    "MoE gate step: router GEMM (fp32 logits) + sigmoid/softmax scores + correction bias + grouped top-k + renormalise + scale",
    args=("hidden", "weight", "bias"),
    params=("top_k", "n_group", "topk_group", "renormalize", "routed_scaling_factor", "scoring"),
    outputs=(("topk_ids", "int64"), ("topk_weights", "float32")),
    scorings=("sigmoid", "softmax"),
    fallback="torch.mm(out_dtype=torch.float32) + torch grouped top-k (hwprofile.ops._gate.select_torch)",
    max_m="moe_gate.max_tokens",
    min_n="moe_gate.min_n",
    max_n="moe_gate.max_n",
    min_k="moe_gate.min_k",
    max_k="moe_gate.max_k",
    routers=_ROUTERS,
    grads=("hidden", "weight"),
    settings=(
        _int("moe_gate.max_tokens", 16, "largest M the fused gate kernel takes (its limit: M <= 16); the cost model decides inside", 0, 16),
        *_kernel_limits("moe_gate", "fused gate kernel", min_n=2, min_k=8, max_n=512),
        _measured("moe_gate"),
        _model("moe_gate"),
    ),
)

#: gate ops, by name
GATES: dict[str, GateDef] = {MOE_GATE.name: MOE_GATE}
#: every op of every kind, by name: what settings, stamps and ``explain`` cover
TABLE: dict[str, OpDef | GateDef] = {**OPS, **GATES}


def get(name: str) -> OpDef:
    """The op called ``name``; an unknown name is an error listing the known ones."""
    op = OPS.get(name)
    if op is None:
        raise KeyError(f"no op {name!r} in hwprofile's op table; known ops: {', '.join(OPS)}" + (
            f" ({name!r} is a gate op: optable.GATES)" if name in GATES else ""))
    return op


def owner(key: str) -> OpDef | GateDef | None:
    """The op whose settings declare ``key`` (``router_gemm.max_tokens`` -> ``ROUTER_GEMM``), or ``None``.

    A measured value of ``key`` applies only when its stamp names this op (``tuning.untied``): a
    sweep of another op measured another kernel against another fallback. Read from the table at call
    time (an op added since import counts).
    """
    every: list[OpDef | GateDef] = [*OPS.values(), *GATES.values()]
    return next((op for op in every if any(s[0] == key for s in op.settings)), None)


def setting_declarations() -> tuple[SettingDecl, ...]:
    """Every op's settings, both kinds, in table order (``settings.CORE_SETTINGS`` declares them)."""
    every: list[OpDef | GateDef] = [*OPS.values(), *GATES.values()]
    return tuple(s for op in every for s in op.settings)
