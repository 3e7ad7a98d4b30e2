"""Launch planning shared by every plugin's fused MoE gate kernel (``hwprofile/moe_gate.cuh``). Pure; imports no other stage.

A fused gate instance is the plugin's router-GEMM tiling plus the selection's ``MAX_N`` (experts a
warp holds: a template argument, so each instance keeps its scores in registers). The bounds here are
the selection's (``moe_gate.cuh``): M <= 16 tokens (the GEMM's 16 MMA rows), N <= 512 experts (16
per lane), top_k <= 32 (lane r writes pick r), n_group <= 32 dividing N (lane g scores group g),
groups of >= 2 experts when grouped (a group's score sums its top two). A shape past one is a
``ValueError`` naming it, which the op's route turns into "the torch path".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .skinny_gemm import check_shape
from .skinny_gemm import plan as plan_skinny

if TYPE_CHECKING:
    from .skinny_gemm import ArchTuning
    from .spec import KernelSpec, Launch

MAX_M = 16
MAX_N = 512
MAX_TOP_K = 32
MAX_GROUPS = 32
#: the MAX_N template arguments instantiated: a gate of N experts takes the smallest that holds N
MAX_N_BUCKETS = (64, 128, 256, 512)


def check_gate(*, m: int, n: int, k: int, n_group: int, topk_group: int, top_k: int, what: str) -> int:
    """The ``ValueError`` a gate planner raises for a shape its kernel cannot take; returns the ``MAX_N`` bucket."""
    check_shape(m=m, n=n, k=k, vec=8, max_m=MAX_M, what=what)
    if not 2 <= n <= MAX_N:
        raise ValueError(f"the {what} takes N = 2..{MAX_N} experts, got N={n}")
    if not 1 <= top_k <= min(MAX_TOP_K, n):
        raise ValueError(f"the {what} takes top_k = 1..{min(MAX_TOP_K, n)}, got top_k={top_k}")
    if not 1 <= n_group <= MAX_GROUPS or n % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(
            f"the {what} takes n_group = 1..{MAX_GROUPS} dividing N and topk_group <= n_group, "
            f"got N={n}, n_group={n_group}, topk_group={topk_group}"
        )
    if n_group > 1 and n // n_group < 2:
        raise ValueError(f"the {what} scores a group by its top-2 experts: groups need >= 2, got {n // n_group}")
    return next(b for b in MAX_N_BUCKETS if n <= b)


def plan_skinny_gate(
    t: ArchTuning, *, m: int, n: int, k: int, split_k: bool, n_group: int = 1, topk_group: int = 1, top_k: int = 1
) -> Launch:
    """The fused gate on the skinny-GEMM family (``<prefix>_moe_gate`` of ``HWP_MOE_GATE_ENTRY_POINT``): the
    family's fp32-output plan for (M, N, K) with the selection's ``MAX_N`` (``hwprofile/moe_gate.cuh``)."""
    from .spec import Launch

    max_n = check_gate(m=m, n=n, k=k, n_group=n_group, topk_group=topk_group, top_k=top_k, what=f"{t.prefix} moe_gate kernel")
    gemm = plan_skinny(t, m=m, n=n, k=k, fp8=False, out="float", scale=0, split_k=split_k)
    head = f"{t.prefix}_skinny_mma<false, float, "
    if not gemm.name_expression.startswith(head):  # the family's fp32 plan is its tensor-core kernel (skinny_gemm.plan)
        raise AssertionError(f"unexpected skinny-GEMM plan {gemm.name_expression} for an fp32 gate")
    mt, warps, nt, ksplit, unroll, _scale = gemm.name_expression[len(head) : -1].split(", ")
    expr = f"{t.prefix}_moe_gate<{mt}, {warps}, {nt}, {ksplit}, {unroll}, {max_n}>"
    return Launch(expr, gemm.grid, gemm.block, 0)


def skinny_gate_spec(package: str, source: str, t: ArchTuning, device: object = None) -> KernelSpec:
    """A Blackwell-class plugin's fused gate spec: ``source`` declares ``HWP_MOE_GATE_ENTRY_POINT(<prefix>, Limits)``.

    Planned for ``device``'s SM count (``Planner``); the pre-built instances are DeepSeek-V3's and
    Kimi-K2's routers (N = 256 and 384, K = 7168) at M <= 8 and M <= 16.
    """
    from functools import partial

    from .skinny_gemm import Planner
    from .spec import KernelSpec

    def plan_for(tuning: ArchTuning, **shape: int) -> Launch:
        return plan_skinny_gate(tuning, **shape)  # type: ignore[arg-type]

    configure = Planner(partial(plan_for), t, device)  # type: ignore[arg-type]
    pre = configure.prebuild()
    instances = tuple(dict.fromkeys(pre(m=m, n=n, k=7168, split_k=True).name_expression for n in (256, 384) for m in (1, 16)))
    return KernelSpec("moe_gate", package, source, instances, configure,
                      doc=f"{t.prefix}_moe_gate: router GEMM + grouped top-k selection of ops.moe_gate in one launch, M <= 16, N <= 512")
