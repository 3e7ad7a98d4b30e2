"""The op table: every op declared once. It must never import torch or CUDA (profiles read it).

One :class:`OpDef` per op holds every fact about the op that more than one module needs: its
contract (argument names, dtypes, output dtype), the settings that gate its kernel (declared here,
turned into :class:`~hwprofile.settings.Setting` objects by ``settings.py``), the dispatch bounds
(constants or setting keys), the identity string of its fallback that tuning stamps record, the
default sweep grid and the kind of threshold a sweep chooses.

Every consumer iterates :data:`OPS` rather than keeping its own list: ``hwprofile.ops`` builds one
run-time entry per op and refuses to import when one lacks a fallback (``ops._fallbacks.FALLBACKS``,
keyed by this table) or a public function; ``decide()`` explains with it, ``sweep`` measures and
writes with it, ``tuning`` stamps its fallback identity, ``kernels.skinny_gemm`` reads its dtypes
and scale modes, the CLI lists it, and tests/ops/ runs its contract suite over it. Adding an op:
the recipe in :mod:`hwprofile.ops`' docstring.
"""

from __future__ import annotations

from typing import Final, final

# fp8_gemv scale modes (the kernels' ``SCALE`` template argument): none, one per tensor, one per row
NO_SCALE: Final = 0
TENSOR_SCALE: Final = 1
ROW_SCALE: Final = 2

Bound = int | str  # a constant, or the key of an int setting read from the profile
SettingDecl = tuple[str, str, object, str, bool, float | None, float | None]  # Setting(key, type, default, doc, bit_identical, min, max)


@final
class OpDef:
    """One op: contract, gates, fallback, sweep. Read-only by convention; built once at import."""

    __slots__ = (
        "args",
        "doc",
        "fallback",
        "grads",
        "grid",
        "k_multiple",
        "k_vec",
        "max_k",
        "max_m",
        "max_n",
        "min_k",
        "min_n",
        "n_multiple",
        "name",
        "out_dtype",
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
    #: the arguments that get gradients (the fallback's math, fp32 accumulation); an argument not
    #: named here that requires grad in grad mode is refused with an error naming the op and argument
    grads: tuple[str, ...]

    def __init__(
        self, name: str, doc: str, *, args: tuple[str, ...], w_dtype: str, out_dtype: str, fallback: str,
        max_m: Bound, min_n: Bound, max_n: Bound, min_k: Bound, max_k: Bound, threshold: str, grid: tuple[tuple[int, int, int], ...],
        settings: tuple[SettingDecl, ...], n_multiple: Bound = 1, k_multiple: Bound = 1, roof: tuple[Bound, Bound] | None = None,
        x_dtype: str = "bfloat16", scale_modes: tuple[int, ...] = (NO_SCALE,), grads: tuple[str, ...] | None = None,
    ) -> None:
        self.name, self.doc, self.args = name, doc, args
        self.x_dtype, self.w_dtype, self.out_dtype, self.scale_modes = x_dtype, w_dtype, out_dtype, scale_modes
        self.k_vec = 16 if w_dtype.startswith("float8") else 8
        self.fallback = fallback
        self.max_m, self.min_n, self.max_n, self.n_multiple = max_m, min_n, max_n, n_multiple
        self.min_k, self.max_k, self.k_multiple, self.roof = min_k, max_k, k_multiple, roof
        if threshold not in ("max_tokens", "box"):
            raise ValueError(f"op {name}: threshold kind {threshold!r} is not 'max_tokens' or 'box'")
        self.threshold, self.grid, self.settings = threshold, grid, settings
        self.grads = args[:2] if grads is None else grads
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


def _mnk_bounds(op: str, what: str, n: tuple[int, int], k: tuple[int, int]) -> tuple[SettingDecl, ...]:
    """N and K bounds of a swept region; the defaults are the default grid's extremes (what was measured)."""
    return (
        _int(f"{op}.min_n", n[0], f"smallest N the {what} is dispatched for (smallest N the sweep measured)", 1),
        _int(f"{op}.max_n", n[1], f"largest N the {what} is dispatched for (largest N the sweep measured)", 0),
        _int(f"{op}.min_k", k[0], f"smallest K the {what} is dispatched for (smallest K the sweep measured)", 1, 1 << 20),
        _int(f"{op}.max_k", k[1], f"largest K the {what} is dispatched for (largest K the sweep measured)", 0, 1 << 20),
    )


def _gemv_settings(op: str, what: str, vec: int) -> tuple[SettingDecl, ...]:
    """A GEMV kernel's bounds. The kernels stream x through shared memory in chunks, so K is bounded by
    what is served, not by shared memory: twice the catalog's longest K (32768), and N past its widest
    LM head (202048); ``vec`` is the kernel's 16-byte load in weight elements (K = 2880 is 180 of 16)."""
    return (
        _int(f"{op}.min_k", 512, f"smallest K the {what} takes", 1, 1 << 20),
        _int(f"{op}.max_k", 65536, f"largest K the {what} takes (x streamed through shared memory in chunks)", 1, 1 << 20),
        _int(f"{op}.k_multiple", vec, f"K must be a multiple of this for the {what} (its 16-byte loads)", 1, 1 << 16),
        _int(f"{op}.n_multiple", 8, f"N must be a multiple of this for the {what}", 1, 1 << 16),
        _int(f"{op}.min_n", 64, f"smallest N the {what} takes", 1),
        _int(f"{op}.max_n", 262144, f"largest N the {what} takes", 1),
        _int(
            f"{op}.cublas_roof_n_min", 12288, f"from this N (inclusive) the fallback is near the bandwidth roof and the {what} is not used"
        ),
        _int(
            f"{op}.cublas_roof_n_max",
            32768,
            "up to this N (exclusive) the fallback is near the bandwidth roof; equal to the min to disable the gap",
        ),
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
        "the path taken at each measured shape; the box rule decides elsewhere",
        True,
        None,
        None,
    )


_ROUTER_GRID = tuple((m, n, 7168) for m in range(1, 17) for n in (256, 384))
_LINEAR_GRID = tuple((m, n, 7168) for m in range(1, 17) for n in (256, 4096))
_GEMV_GRID = tuple((1, n, k) for n in (2048, 4096, 7168, 12288, 16384, 28672) for k in (2048, 4096, 7168, 16384))
# FP8: wide N too (the old fallback dequantised the whole weight, so the kernel won everywhere)
_FP8_GRID = (*tuple((1, n, k) for n in (2048, 4096, 7168, 12288, 28672, 57344) for k in (2048, 4096, 7168)), (1, 152064, 5120))

MM_FP32 = "torch.mm(out_dtype=torch.float32)"

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
    settings=(
        _int(
            "router_gemm.max_tokens",
            16,
            "largest M the JIT router GEMM is dispatched for; measured against the fp32-output cuBLAS fallback",
            0,
            16,
        ),
        *_mnk_bounds("router_gemm", "JIT router GEMM", (256, 384), (7168, 7168)),
        _measured("router_gemm"),
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
    settings=(
        _int(
            "linear_bf16_fp32.max_tokens",
            0,
            "largest M for which linear_bf16_fp32 uses the plugin's small-M kernel instead of cuBLAS (0: never)",
            0,
            16,
        ),
        *_mnk_bounds("linear_bf16_fp32", "small-M linear kernel", (256, 4096), (7168, 7168)),
        _measured("linear_bf16_fp32"),
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
    ),
)
FP8_GEMV = OpDef(
    "fp8_gemv",
    "FP8 GEMV: x[..., K] bf16 . (w[N, K] e4m3 * scale)^T -> [..., N] bf16, scale per tensor ([] or [1]) or per row ([N])",
    args=("x", "w", "scale"),
    w_dtype="float8_e4m3fn",
    out_dtype="bfloat16",
    scale_modes=(TENSOR_SCALE, ROW_SCALE),
    fallback="chunked exact bf16 dequantise + torch.mm(out_dtype=torch.float32) + fp32 scale",
    max_m=1,
    min_n="fp8_gemv.min_n",
    max_n="fp8_gemv.max_n",
    n_multiple="fp8_gemv.n_multiple",
    min_k="fp8_gemv.min_k",
    max_k="fp8_gemv.max_k",
    k_multiple="fp8_gemv.k_multiple",
    roof=("fp8_gemv.cublas_roof_n_min", "fp8_gemv.cublas_roof_n_max"),
    threshold="box",
    grid=_FP8_GRID,
    grads=("x",),  # an e4m3 weight and its scale are quantised, frozen: a gradient for them is refused
    settings=(*_gemv_settings("fp8_gemv", "FP8 e4m3 GEMV kernel (M = 1)", 16), _measured("fp8_gemv")),
)

#: every op, by name, in the order the CLI and the docs list them
OPS: dict[str, OpDef] = {op.name: op for op in (ROUTER_GEMM, LINEAR_BF16_FP32, GEMV, FP8_GEMV)}

# --- the second contract kind: gates (a GEMM followed by a selection) ----------------------------

GEMM_KIND: Final = "gemm"  #: OpDef: ``x . w^T`` -> one tensor; ABI ``(out, x, w, scale, M, N, K)``
GATE_KIND: Final = "gate"  #: GateDef: router GEMM + expert selection -> ``(ids, weights)``; ABI of ``ops._gate.ARG_TYPES``


@final
class Router:
    """One served router's selection settings: what a gate sweep and benchmark time at its (N, K)."""

    __slots__ = ("k", "n", "n_group", "name", "renormalize", "scaling", "scoring", "top_k", "topk_group")

    def __init__(self, name: str, n: int, k: int, *, top_k: int, n_group: int = 1, topk_group: int = 1, renormalize: bool = True,
                 scaling: float = 1.0, scoring: str = "sigmoid") -> None:
        self.name, self.n, self.k, self.top_k, self.n_group, self.topk_group = name, n, k, top_k, n_group, topk_group
        self.renormalize, self.scaling, self.scoring = renormalize, scaling, scoring

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
        _int("moe_gate.max_tokens", 16, "largest M the fused gate kernel is dispatched for; measured against the torch gate step", 0, 16),
        *_mnk_bounds("moe_gate", "fused gate kernel", (64, 512), (2048, 7168)),
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
    for op in (*OPS.values(), *GATES.values()):
        if any(s[0] == key for s in op.settings):
            return op
    return None


def setting_declarations() -> tuple[SettingDecl, ...]:
    """Every op's settings, both kinds, in table order (``settings.CORE_SETTINGS`` declares them)."""
    return tuple(s for op in (*OPS.values(), *GATES.values()) for s in op.settings)
