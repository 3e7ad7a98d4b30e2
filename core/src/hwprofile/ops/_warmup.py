"""Warm-up: make every first call of the given shapes safe inside a CUDA-graph capture. Imports torch only when run.

:func:`warmup` (``hwprofile.ops.warmup``) takes the shapes an engine will serve, by op or by served
model (:mod:`hwprofile.models`), and for each one asks the ops' own routing (:func:`~hwprofile.ops.decide`
on the device's profile, the facts dispatch uses) which path it takes:

* a **kernel** shape is planned and loaded exactly as its first call would (``_kernel._load`` on
  the device's dispatch table: the launcher it leaves is the one dispatch then finds), in every
  scale mode of a scaled op, so the compile (or cache read) and the module load happen now;
* every op's **fallback** is run once on the device's current stream, so its libraries exist
  (cuBLAS and cuBLASLt handles, created lazily on a first call, cannot be created inside a
  capture), and the op is marked ready (``_kernel.fallback_ready``): a later first call inside a
  capture may then take the fallback instead of breaking the capture.

:func:`plan` is the routing half alone (no torch, no GPU): ``hwprofile compile --warm`` uses it
to fill the cache with exactly the instances warm-up would load.

cuBLAS handles are per device *and thread* in torch: warm up in the thread that captures.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _env
from .._log import get_logger
from .._record import Record, final
from ..errors import HwprofileError
from ..optable import GATES, NO_SCALE, OPS, ROW_SCALE, TABLE, TENSOR_SCALE

if TYPE_CHECKING:
    from ..kernels.spec import Launch
    from ..profiles import Profile

log = get_logger(__name__)

Shape = tuple[int, int, int]
#: Largest weight (elements) a fallback's warm-up call allocates: a larger N is cut to fit (the
#: libraries it initialises do not depend on N; 128 Mi elements is 256 MiB of bf16).
MAX_WARM_WEIGHT = 1 << 27


@final
class Planned(Record):
    """One (op, shape, scale mode) and the path routing gives it; ``launch`` is the kernel's plan, or None for the fallback."""

    op: str
    shape: Shape
    mode: int
    path: str
    reason: str
    launch: Launch | None = None


@dataclass
class WarmupReport:
    """What :func:`warmup` did: every planned shape, what failed, which fallbacks it initialised, the pipeline counts."""

    device: int
    planned: list[Planned] = field(default_factory=list)
    loaded: int = 0
    failed: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    kernels: dict[str, Any] = field(default_factory=dict)


def shapes_of(shapes: Mapping[str, Iterable[Shape]] | None = None, models: Iterable[str] = ()) -> dict[str, list[Shape]]:
    """The shapes to warm by op: ``shapes`` ({op: [(M, N, K), ...]}) plus every shape of the named served models.

    An unknown op or model, or a shape that is not three ints >= 0, is a ``ValueError`` / ``SettingError`` naming it.
    """
    out: dict[str, list[Shape]] = {}
    for op, items in (shapes or {}).items():
        if op not in TABLE:
            raise ValueError(f"warmup: no op {op!r}; known ops: {', '.join(TABLE)}")
        for s in items:
            ok = isinstance(s, tuple | list) and len(s) == 3
            if not (ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in s)):
                raise ValueError(f"warmup: {op} shape {s!r} is not (M, N, K) of ints >= 0")
            out.setdefault(op, []).append((int(s[0]), int(s[1]), int(s[2])))
    names = [n for n in models]
    if names:
        from .. import models as catalog

        chosen = catalog.select(catalog.load(), names)
        for op in TABLE:  # a gate's shapes are its GEMM's, the router's (models.origins)
            out.setdefault(op, []).extend(catalog.shapes(op, chosen))
    if not out:
        raise ValueError("warmup: give the shapes to warm (shapes={op: [(M, N, K), ...]}) or served models (models=[name, ...])")
    return {op: list(dict.fromkeys(v)) for op, v in out.items() if v}


def parse_shapes(text: str) -> dict[str, list[Shape]]:
    """``"gemv:1x4096x4096,1x8192x4096;router_gemm:8x256x7168"`` -> {op: [(M, N, K), ...]} (the CLI's ``--warm``)."""
    out: dict[str, list[Shape]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        op, sep, rest = part.partition(":")
        op = op.strip()
        if not sep or op not in TABLE:
            raise ValueError(f"--warm {part!r}: write OP:MxNxK[,MxNxK...] with OP one of {', '.join(TABLE)}, several ops separated by ';'")
        for item in filter(None, (x.strip() for x in rest.split(","))):
            dims = item.lower().split("x")
            if len(dims) != 3 or not all(d.strip().isdigit() for d in dims):
                raise ValueError(f"--warm {op}: shape {item!r} is not MxNxK (e.g. 1x4096x4096)")
            m, n, k = (int(d) for d in dims)
            out.setdefault(op, []).append((m, n, k))
    if not out:
        raise ValueError("--warm names no shape; write OP:MxNxK[,MxNxK...], several ops separated by ';'")
    return out


def _modes(op: str) -> tuple[int, ...]:
    return (TENSOR_SCALE, ROW_SCALE) if OPS[op].scaled else (NO_SCALE,)


def plan(prof: Profile, shapes: Mapping[str, Iterable[Shape]], split_k: bool) -> list[Planned]:
    """Route every shape with :func:`~hwprofile.ops.decide` on ``prof`` and plan the kernel ones (no torch, no GPU)."""
    from ._dispatch import _Table, decide

    out: list[Planned] = []
    t = _Table(prof)
    for gate in GATES:  # the gate kind: routed and planned with its served router's selection (optable.GateDef.router_for)
        from ._gate import route_gate

        for m, n, k in shapes.get(gate, ()):
            r = GATES[gate].router_for(n, k)
            g, launch, why = route_gate(t, m, n, k, r.n_group, r.topk_group, r.top_k)
            out.append(Planned(gate, (m, n, k), NO_SCALE, "kernel" if g is None else "fallback", why, launch))
    for op in OPS:
        for m, n, k in shapes.get(op, ()):
            d = decide(op, prof, m=m, n=n, k=k)
            for mode in _modes(op):
                launch = None
                if d.path == "kernel":
                    spec = prof.kernels[op]
                    sk = t.routes[op].split_k(m, n, k)  # the variant dispatch launches there (None: the profile's)
                    sk = split_k if sk is None else sk
                    launch = spec.configure(m=m, n=n, k=k, split_k=sk, **({"scale": mode} if OPS[op].scaled else {}))
                out.append(Planned(op, (m, n, k), mode, d.path, d.reason, launch))
    return out


def _refuse_without_cuda(torch: Any, prof: Any, idx: int) -> None:
    """A clear error, instead of torch's AssertionError at the first tensor, when this torch cannot reach CUDA device ``idx``."""
    if torch.cuda.is_available() and idx < torch.cuda.device_count():
        return
    d = prof.device
    what = f"device {idx} ({d.name}{f', simulated by {_env.DEVICE.name}' if d.simulated else ''})"
    why = (f"torch {torch.__version__} is a CPU build (no CUDA)" if torch.version.cuda is None
           else f"torch sees {torch.cuda.device_count()} CUDA device(s)")
    raise HwprofileError(
        f"hwprofile.ops.warmup cannot warm {what}: {why}, and warm-up runs each op's fallback and the gate on that GPU. "
        f"Run it on the GPU host with a CUDA build of torch; to fill a kernel cache without a GPU, use 'hwprofile compile "
        f"--arch {prof.target or 'TARGET'} --warm OP:MxNxK' (or --models); warmup(..., fallbacks=False) only compiles and loads"
    )


def warmup(
    device: int | str | Any = None, shapes: Mapping[str, Iterable[Shape]] | None = None, *, models: Iterable[str] = (),
    fallbacks: bool = True,
) -> WarmupReport:
    """Compile and load every kernel instance the profile dispatches ``shapes`` to, and initialise every op's fallback.

    ``shapes`` is ``{op: [(M, N, K), ...]}``; ``models`` adds every decode shape of served models from
    :mod:`hwprofile.models` (``["llama-3.1-8b"]``). Runs on ``device`` (default: the current one),
    on its current stream, in this thread (torch's cuBLAS handles are per thread). Afterwards a first
    call of any of these shapes, kernel or fallback, works inside a CUDA-graph capture; call
    ``hwprofile.kernels.forbid_compile()`` next to prove nothing compiles while serving.

    A kernel that fails to build or load warns once and its op falls back, as on a first call
    (``HWPROFILE_STRICT=1`` raises). Calling it inside a capture is an error.
    """
    import torch

    from ..profiles import profile
    from . import _dispatch, _gate, _kernel, _library

    if not _library.registered():
        _library.register()  # binds torch into the fallbacks
    wanted = shapes_of(shapes, models)
    t0 = time.perf_counter()
    idx = profile(device).device.index
    if _kernel._capturing(idx):
        raise HwprofileError("hwprofile.ops.warmup was called inside a CUDA-graph capture; warm up before capturing")
    t = _dispatch.table(idx)
    if idx != _dispatch._cpu_index and (fallbacks or any(op in wanted for op in GATES)):
        _refuse_without_cuda(torch, t.prof, idx)  # before any compile: the fallbacks and the gate run on that GPU
    report = WarmupReport(idx)
    report.planned = plan(t.prof, wanted, t.split_k)
    for p in report.planned:
        if p.path != "kernel" or p.op in GATES:  # a gate's kernel is warmed by _gate.warm below
            continue
        sk = t.routes[p.op].split_k(*p.shape)  # the kernel variant dispatch launches at this shape
        split = t.split_k if sk is None else sk
        key = (p.op, *p.shape, p.mode, split)
        if key in t.launches:
            report.loaded += 1
            continue
        go = _kernel._load(t, p.op, *p.shape, p.mode, split)
        if go is None:
            report.failed.append(f"{p.op} M={p.shape[0]} N={p.shape[1]} K={p.shape[2]}")
        else:
            report.loaded += 1
    dev = torch.device("cpu") if idx == _dispatch._cpu_index else torch.device("cuda", idx)
    for op in GATES:  # the gate kind: its fused kernel and counter workspace, its torch path
        if op in wanted:
            ready, failed = _gate.warm(t, dev, wanted[op])
            report.loaded += ready
            report.failed += failed
            if fallbacks:
                _warm_gate_fallback(dev, wanted[op])
                _kernel.fallback_ready.add((op, idx, _kernel.thread_id()))
                report.fallbacks.append(op)
    if fallbacks:
        for op in OPS:
            if op in wanted:
                _warm_fallback(idx, op, wanted[op])
                _kernel.fallback_ready.add((op, idx, _kernel.thread_id()))
                report.fallbacks.append(op)
        if dev.type == "cuda" and any(op in OPS and OPS[op].scaled for op in wanted):
            # the FP8 fallback's split path is probed on its first call outside a capture; a warm-up of small weights
            # alone never makes that call, and a first large call inside a capture would record the dequantising path
            from ._fallbacks import probe_fp8_split

            probe_fp8_split(idx)
    report.seconds = time.perf_counter() - t0
    report.kernels = t.prof.stats.kernel_counts()
    log.info("hwprofile warm-up of cuda:%d: %d kernel instances ready, fallbacks of %s initialised in %.2f s",
             idx, report.loaded, ", ".join(report.fallbacks) or "no op", report.seconds)
    return report


def _warm_fallback(idx: int, op: str, shapes: Iterable[Shape]) -> None:
    """Run ``op``'s fallback once per distinct M (N cut to :data:`MAX_WARM_WEIGHT`) on device ``idx``'s current stream."""
    import torch

    from . import _dispatch
    from ._fallbacks import FALLBACKS

    d = OPS[op]
    dev = torch.device("cpu") if idx == _dispatch._cpu_index else torch.device("cuda", idx)
    fn = FALLBACKS[op]
    seen: set[int] = set()
    for m, n, k in shapes:
        if m in seen or not (m and n and k):
            continue
        seen.add(m)
        n = max(1, min(n, MAX_WARM_WEIGHT // max(k, 1)))
        x = torch.zeros((m, k), dtype=getattr(torch, d.x_dtype), device=dev)
        w = torch.zeros((n, k), dtype=torch.bfloat16, device=dev).to(getattr(torch, d.w_dtype))
        if d.scaled:
            for scale in (torch.ones(1, dtype=torch.float32, device=dev), torch.ones(n, dtype=torch.float32, device=dev)):
                fn(x, w, scale)
        else:
            fn(x, w)
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()


def _warm_gate_fallback(dev: Any, shapes: Iterable[Shape]) -> None:
    """Run the gate's torch path once per distinct M: its cuBLAS GEMM and the selection's kernels exist afterwards."""
    import torch

    from ..optable import MOE_GATE
    from ._gate import fallback

    seen: set[int] = set()
    for m, n, k in shapes:
        if m in seen or not (m and n and k):
            continue
        seen.add(m)
        r = MOE_GATE.router_for(n, k)
        x = torch.zeros((m, k), dtype=torch.bfloat16, device=dev)
        w = torch.zeros((n, k), dtype=torch.bfloat16, device=dev)
        b = torch.zeros(n, dtype=torch.float32, device=dev)
        for scoring in MOE_GATE.scorings:
            fallback(x, w, b, r.n_group, r.topk_group, r.top_k, r.renormalize, r.scaling, scoring)
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()
