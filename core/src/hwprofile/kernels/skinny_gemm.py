"""Launch planning for the shared skinny-GEMM kernel bodies (``include/hwprofile/gemv.cuh``); never launches.

Architecture plugins describe their SM (multiprocessor count, shared memory per block, largest
portable cluster, the prefix of their entry points) in an :class:`ArchTuning` and get the four op
kernels (router GEMM, fp32-output linear, bf16 GEMV, FP8 GEMV) as :class:`~hwprofile.kernels.KernelSpec`
objects whose ``configure`` picks tile sizes and the split-K factor for a shape. Each plugin's
source declares the entry points its plans name, ``<prefix>_skinny_mma`` and ``<prefix>_gemv_simt``,
with static_asserts for its SM's limits (``HWP_SKINNY_GEMM_ENTRY_POINTS`` of
``hwprofile/skinny_entry.cuh`` writes both; sm90 declares only ``hwp90_gemv_simt``, its fp32-output
kernel is its own); the dynamic shared memory is checked here.

A plugin with kernels of its own for some of these ops (hwprofile-sm90) plans them itself and still
takes the pre-built shapes (:data:`PREBUILT_SHAPES`) and instance lists (:func:`prebuilt_instances`)
from here. Plugins reach all of it through :mod:`hwprofile.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from .. import optable
from .._record import Record, final
from ..optable import NO_SCALE
from .spec import KernelSpec, Launch

if TYPE_CHECKING:
    from ..device import DriverAttributes

    class _HasAttributes(Protocol):
        def attributes(self) -> DriverAttributes: ...

Shape = tuple[int, int, int]  # (M, N, K)


@final
class ArchTuning(Record):
    """Per-SM constants the launch plan depends on (defaults measured on the H200, see benchmarks/)."""

    #: Multiprocessors on the SM generation's reference card.
    sm_count: int
    #: Opt-in shared memory per block, bytes.
    max_shared_bytes: int
    #: Largest portable thread-block cluster.
    max_cluster: int = 8
    #: Entry points ``<prefix>_skinny_mma`` / ``<prefix>_gemv_simt`` in the plugin's source.
    prefix: str = "hwp"
    #: Tensor-core kernel (fp32 out, M <= 16): warps per block, each one n8 tile ...
    mma_warps: int = 8
    #: ... n8 tiles per warp ...
    mma_nt: int = 1
    #: ... and K chunks per batch.
    mma_unroll: int = 4
    #: Split K over a cluster until the grid has this many blocks per SM.
    mma_blocks_per_sm: float = 1.4
    #: SIMT kernel (M = 1): warps per block ...
    simt_warps: int = 4
    #: ... rows per warp ...
    simt_rows: int = 2
    #: ... 16-byte vectors per row per batch (bf16) ...
    simt_unroll: int = 4
    #: ... and for FP8.
    fp8_unroll: int = 2
    #: Split K in 2 when the grid has fewer blocks per SM than this.
    simt_split_below: float = 3.0
    #: Stage a block's whole x slice in shared memory up to this many bytes (K = 16384 bf16 at the
    #: default: every shape the H200 sweeps measured) ...
    simt_x_whole_max: int = 32 * 1024
    #: ... and past it stream x through two buffers of this many bytes together (per token), one
    #: filled by cp.async while the other is read: at 64 KB of x per block (K = 32768) only 3
    #: blocks of 4 warps would fit on an SM.
    simt_x_chunk: int = 16 * 1024


#: Largest K and N any plan takes: the settings' own upper bound on K (so no in-bounds K is refused
#: for its size), and an N whose grid of 8-row groups stays far below CUDA's 2^31 - 1 blocks.
MAX_K: Final = 1 << 20
MAX_N: Final = 1 << 24


def for_device(t: ArchTuning, device: _HasAttributes) -> ArchTuning:
    """``t`` with the SM count and opt-in shared memory per block of ``device``, where known.

    A real GPU's come from its driver, a simulated one's from its catalog entry
    (:meth:`~hwprofile.device.DeviceInfo.attributes`): a GB300 (152 SMs) is not planned as a B200
    (148), nor an RTX 5090 (170) as an RTX PRO 6000 (188). The shared memory is never raised past
    the architecture's own limit (what the kernels' static_asserts were written against).
    """
    a = device.attributes()
    sms = a.sm_count if a.sm_count else t.sm_count
    smem = min(t.max_shared_bytes, a.max_shared_memory_per_block_optin) if a.max_shared_memory_per_block_optin else t.max_shared_bytes
    return t.replace(sm_count=sms, max_shared_bytes=smem)


class Planner:
    """A :class:`~hwprofile.kernels.KernelSpec`'s ``configure``: ``fn(tuning, **shape)`` planned for a device.

    With ``device``, the tuning is :func:`for_device`'s: the device's own SM count and shared memory.
    A real GPU's are read from the driver on the first plan (a launch, a plan digest), never while a
    profile resolves: reading them initialises the CUDA driver, which the first ``profile()`` must not
    pay for. ``plan_basis`` (the tuning's repr) goes into the plan digest a stamp records
    (:func:`hwprofile.tuning.plan_digest`), so a sweep on a 152-SM GB300 is not taken for one on a
    148-SM B300 even where the sweep grid's launches coincide.
    """

    __slots__ = ("_device", "_fn", "_reference", "_tuning")

    def __init__(self, fn: Callable[..., Launch], tuning: ArchTuning, device: _HasAttributes | None = None) -> None:
        self._fn = fn
        self._reference = tuning
        self._device = device
        # a simulated device's attributes are its catalog entry's: free to read now
        eager = device is None or getattr(device, "catalog_attributes", None) is not None
        self._tuning: ArchTuning | None = (tuning if device is None else for_device(tuning, device)) if eager else None

    @property
    def tuning(self) -> ArchTuning:
        """What the plans are computed for (resolved from the device on first use)."""
        if self._tuning is None:
            assert self._device is not None
            self._tuning = for_device(self._reference, self._device)
        return self._tuning

    @property
    def resolved(self) -> bool:
        """Whether the plans are known without reading the driver (a simulated device, or read already)."""
        return self._tuning is not None

    @property
    def plan_basis(self) -> str:
        return repr(self.tuning)

    def prebuild(self) -> Planner:
        """The planner whose plans name the pre-built instances: this one where its tuning is known
        without the driver, else the reference card's (a real GPU's other instances compile on first use)."""
        return self if self._tuning is not None else Planner(self._fn, self._reference)

    def __call__(self, **shape: Any) -> Launch:
        return self._fn(self.tuning, **shape)

    def __repr__(self) -> str:
        return f"Planner({self._tuning!r})" if self._tuning is not None else f"Planner(unresolved, device {id(self._device):#x})"


def check_shape(*, m: int, n: int, k: int, vec: int, max_m: int, what: str) -> None:
    """Refuse, naming the limit, a shape no plan of the family takes (so a gate can refuse it first)."""
    if not 1 <= m <= max_m:
        raise ValueError(f"the {what} takes {'M = 1' if max_m == 1 else f'1 <= M <= {max_m}'}, got M={m}")
    if not 1 <= n <= MAX_N:
        raise ValueError(f"the {what} takes 1 <= N <= {MAX_N}, got N={n}")
    if not vec <= k <= MAX_K:
        raise ValueError(f"the {what} takes {vec} <= K <= {MAX_K}, got K={k}")
    if k % vec:
        raise ValueError(f"the {what} needs K to be a multiple of {vec} (16-byte loads), got K={k}")


#: The FP8 GEMV's tensor-core tiles at M = 2..16 (``hwprofile/skinny_fp8.cuh``): warps per block (they split the
#: block's K range), n8 tiles per warp, and K chunks of 64 per batch by M tile. Every block reads all M x K of x
#: (from L2, or L1 where a block beside it on the SM read it first): 2M bytes of x per weight row of the block
#: against K bytes of weight, so 32 rows a block (4 tiles) keep x's traffic at or under the weight's at 16 tokens,
#: where one tile (8 rows) would read 4x the weight's bytes in x. Batches: 8 tokens 4 chunks (8 KB of weight in
#: flight per warp); 16 tokens 2 (x's registers double). Not measured yet: benchmarks/run_h200.sh fp8m times the
#: op with them (module constants, not ArchTuning fields, so the plan digests of the bf16 ops' shipped tables do
#: not move with them).
FP8_MMA_WARPS: Final = 8
FP8_MMA_NT: Final = 4
FP8_MMA_UNROLL: Final = {1: 4, 2: 2}
#: The largest M each kernel of the family takes: the tensor-core kernel (fp32 output, and the FP8 GEMV) 16,
#: the bf16 GEMV's SIMT kernel 1.
MMA_MAX_M: Final = 16


def max_m(*, fp8: bool, out: str) -> int:
    """The largest M the family plans for an op of these dtypes (the op table's ``max_m`` is the same number)."""
    return MMA_MAX_M if out == "float" or fp8 else 1


def mma_split(t: ArchTuning, *, groups: int, chunks: int, warps: int) -> int:
    """The tensor-core kernel's split-K (cluster size) with split-K on: double it while the grid has fewer than
    ``mma_blocks_per_sm`` blocks per SM and every warp of every rank keeps two K chunks."""
    ksplit = 1
    while ksplit < t.max_cluster and groups * ksplit < t.mma_blocks_per_sm * t.sm_count and chunks >= 2 * ksplit * warps:
        ksplit *= 2
    return ksplit


def plan_fp8_mma(t: ArchTuning, *, m: int, n: int, k: int, scale: int, split_k: bool) -> Launch:
    """The FP8 GEMV at M = 2..16 on the tensor cores (``<prefix>_skinny_mma<true, ...>``); a checked shape."""
    if scale == NO_SCALE:
        raise ValueError(f"the FP8 GEMV kernel needs a scale (per tensor or per row), got scale mode {scale} ({t.prefix})")
    mt = 1 if m <= 8 else 2
    groups = -(-n // (8 * FP8_MMA_NT))
    ksplit = mma_split(t, groups=groups, chunks=-(-k // 64), warps=FP8_MMA_WARPS) if split_k else 1
    unroll = FP8_MMA_UNROLL[mt]
    expr = f"{t.prefix}_skinny_mma<true, __nv_bfloat16, {mt}, {FP8_MMA_WARPS}, {FP8_MMA_NT}, {ksplit}, {unroll}, {scale}>"
    return Launch(expr, (groups, ksplit, 1), (FP8_MMA_WARPS * 32, 1, 1), 0)


def plan(t: ArchTuning, *, m: int, n: int, k: int, fp8: bool, out: str, scale: int, split_k: bool) -> Launch:
    """Kernel, tiles and split-K for one call; pure, so it is tested on the CPU for every architecture.

    fp32 output (router GEMM, small-M linear) takes the tensor-core kernel; bf16 output at M = 1
    (GEMV, FP8 GEMV) takes the SIMT kernel, whose row-contiguous loads stream HBM best; the FP8 GEMV
    at M = 2..16 takes the FP8 tensor-core kernel (:func:`plan_fp8_mma`), which reads each weight
    once for all M tokens. A shape no kernel takes is a ``ValueError`` naming the limit.
    """
    vec = 16 if fp8 else 8
    mma = out == "float" and not fp8
    top = max_m(fp8=fp8, out=out)
    what = "skinny-GEMM kernel" if mma else "FP8 GEMV kernel" if fp8 else "bf16-output GEMV kernel"
    check_shape(m=m, n=n, k=k, vec=vec, max_m=top, what=what)
    tout = "float" if out == "float" else "__nv_bfloat16"
    f8 = "true" if fp8 else "false"
    if fp8 and m > 1:
        if out != "bf16":
            raise ValueError(f"the FP8 GEMV kernel writes bf16, not {out} ({t.prefix})")
        return plan_fp8_mma(t, m=m, n=n, k=k, scale=scale, split_k=split_k)
    if mma:
        rows = 8 * t.mma_nt
        groups = -(-n // rows)
        ksplit = mma_split(t, groups=groups, chunks=-(-k // 32), warps=t.mma_warps) if split_k else 1
        mt = 1 if m <= 8 else 2
        expr = f"{t.prefix}_skinny_mma<{f8}, {tout}, {mt}, {t.mma_warps}, {t.mma_nt}, {ksplit}, {t.mma_unroll}, {scale}>"
        return Launch(expr, (groups, ksplit, 1), (t.mma_warps * 32, 1, 1), 0)
    rows = t.simt_warps * t.simt_rows
    groups = -(-n // rows)
    ksplit = 2 if split_k and groups < t.simt_split_below * t.sm_count and k // vec >= 64 else 1
    unroll = t.fp8_unroll if fp8 else t.simt_unroll
    xbytes = 32 if fp8 else 16  # x bytes per 16-byte weight vector
    whole = -(-(k // vec) // ksplit) * xbytes  # bytes of x each block would stage whole
    xchunk = 0
    smem = whole
    if whole > t.simt_x_whole_max:
        batch = 32 * unroll  # weight vectors per warp batch: a chunk holds whole batches
        xchunk = t.simt_x_chunk // 2 // xbytes // batch * batch  # two buffers
        if xchunk < batch:
            raise ValueError(
                f"ArchTuning.simt_x_chunk={t.simt_x_chunk} bytes holds no two chunks of {batch} weight vectors ({t.prefix})"
            )
        smem = 2 * xchunk * xbytes
    static = t.simt_warps * t.simt_rows * 4 if ksplit > 1 else 0  # the split-K reduction's buffer
    if smem + static > t.max_shared_bytes:
        raise ValueError(
            f"the GEMV's x buffer ({smem} bytes) and reduction ({static} bytes) exceed the {t.max_shared_bytes} bytes "
            f"of shared memory per block of this device ({t.prefix}, K={k}, split-K {ksplit})"
        )
    tail = f", {xchunk}" if xchunk else ""  # whole-slice instances keep their names (XCHUNK defaults to 0)
    expr = f"{t.prefix}_gemv_simt<{f8}, {tout}, 1, {t.simt_warps}, {t.simt_rows}, {ksplit}, {unroll}, {scale}{tail}>"
    return Launch(expr, (groups, ksplit, 1), (t.simt_warps * 32, 1, 1), smem)


#: The ops the family's kernels compute (those the op table declares ``family=SKINNY_GEMM``), each with the (M, N, K)
#: shapes whose instances ``hwprofile compile`` pre-builds: a read-only view of the op table (``OpDef.family`` and
#: ``OpDef.prebuilt``; both declared there, once).
PREBUILT_SHAPES: Final[Mapping[str, tuple[Shape, ...]]] = MappingProxyType(
    {op: d.prebuilt for op, d in optable.OPS.items() if d.family == optable.SKINNY_GEMM}
)


def _doc(d: optable.OpDef) -> str:
    """A family kernel's one-line description, from the op's dtypes."""
    if d.out_dtype == "float32":
        return f"skinny GEMM on tensor cores (mma.sync), M = 1..16: {d.x_dtype} x {d.w_dtype} -> float32"
    if d.scaled:
        return (
            "FP8 e4m3 weights, per-tensor or per-row scale: SIMT GEMV at M = 1, tensor cores at M = 2..16, "
            f"fp32 accumulation -> {d.out_dtype}"
        )
    return f"SIMT GEMV, M = 1: {d.w_dtype} weights, fp32 accumulation -> {d.out_dtype}"


def prebuilt_instances(op: str, configure: Callable[..., Launch], shapes: tuple[Shape, ...] | None = None) -> tuple[str, ...]:
    """The sorted, distinct name expressions ``configure`` plans for ``op``'s pre-built shapes.

    ``configure`` is called as a :class:`~hwprofile.kernels.KernelSpec`'s is: ``m=, n=, k=, split_k=``,
    plus ``scale=`` for each of the op's scale modes when the op table says the op is scaled; every
    shape with split-K on and off. ``shapes`` defaults to ``PREBUILT_SHAPES[op]``.
    """
    d = optable.get(op)  # scale modes: declared once, in the op table
    todo = PREBUILT_SHAPES[op] if shapes is None else shapes
    exprs = {
        configure(m=m, n=n, k=k, split_k=sk, **({"scale": sc} if d.scaled else {})).name_expression
        for m, n, k in todo
        for sc in d.scale_modes
        for sk in (True, False)
    }
    return tuple(sorted(exprs))


def kernel_specs(
    package: str, source: str, t: ArchTuning, *, ops: tuple[str, ...] | None = None, device: _HasAttributes | None = None
) -> list[KernelSpec]:
    """The op kernels of the skinny-GEMM family for one SM (``ops``, default every op of :data:`PREBUILT_SHAPES`).

    ``configure(m=, n=, k=, split_k=, scale=)`` returns the launch for a call, planned for
    ``device``'s SM count and shared memory when one is given (:class:`Planner`), for ``t`` as it
    is otherwise; the pre-built instances are :func:`prebuilt_instances` of it.
    """
    specs = []
    for op in tuple(PREBUILT_SHAPES) if ops is None else ops:
        d = optable.get(op)  # dtypes and scale modes: declared once, in the op table
        if op not in PREBUILT_SHAPES:
            raise ValueError(f"the skinny-GEMM family has no kernel for op {op!r}; it computes {', '.join(PREBUILT_SHAPES)}")
        configure = Planner(partial(_configure, fp8=d.scaled, out=d.kernel_out), t, device)
        specs.append(KernelSpec(op, package, source, prebuilt_instances(op, configure.prebuild()), configure, doc=_doc(d)))
    return specs


def _configure(t: ArchTuning, *, fp8: bool, out: str, m: int, n: int, k: int, split_k: bool, scale: int = NO_SCALE) -> Launch:
    return plan(t, m=m, n=n, k=k, fp8=fp8, out=out, scale=scale, split_k=split_k)
