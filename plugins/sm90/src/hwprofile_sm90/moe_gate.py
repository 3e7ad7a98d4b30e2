"""The sm90 kernel of ``hwprofile.ops.moe_gate``'s expert selection (``kernels/moe_gate.cu``) and its launch plan.

The gate step runs the router GEMM (the ``router_gemm`` kernel, launched with programmatic
dependent launch) and then this kernel on the same stream, also with PDL, so its blocks start while
the GEMM finishes; it replaces the ~15 torch kernels of the selection by one. Its rules are
``hwprofile.ops._fallbacks.grouped_topk``'s. The plan is pure, so its bounds are tested on the CPU.
"""

from __future__ import annotations

from hwprofile.plugin import KernelSpec, Launch

SOURCE = "kernels/moe_gate.cu"
OP = "moe_gate"
MAX_M = 16  # tokens of a decode step; a larger M is a prefill, where the torch selection's kernels are amortised
MAX_N = 512  # experts: one warp per token, 16 per lane (the kernel's MAX_N template argument)
MAX_TOP_K = 32  # lane r writes pick r
MAX_GROUPS = 32  # lane g scores group g
INSTANCE = f"hwp90_moe_gate<{MAX_N}>"


def plan_gate(*, m: int, n: int, n_group: int, topk_group: int, top_k: int) -> Launch:
    """The launch for ``m`` tokens of ``n`` experts (grid M, one warp each, PDL); a ValueError names the bound a call breaks."""
    if not 1 <= m <= MAX_M:
        raise ValueError(f"the sm90 moe_gate kernel takes M = 1..{MAX_M} tokens, got M={m}")
    if not 2 <= n <= MAX_N:
        raise ValueError(f"the sm90 moe_gate kernel takes N = 2..{MAX_N} experts, got N={n}")
    if not 1 <= top_k <= min(MAX_TOP_K, n):
        raise ValueError(f"the sm90 moe_gate kernel takes top_k = 1..{min(MAX_TOP_K, n)}, got top_k={top_k}")
    if not 1 <= n_group <= MAX_GROUPS or n % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(
            f"the sm90 moe_gate kernel takes n_group = 1..{MAX_GROUPS} dividing N and topk_group <= n_group, "
            f"got N={n}, n_group={n_group}, topk_group={topk_group}"
        )
    if n_group > 1 and n // n_group < 2:
        raise ValueError(f"the sm90 moe_gate kernel scores a group by its top-2 experts: groups need >= 2, got {n // n_group}")
    return Launch(INSTANCE, (m, 1, 1), (32, 1, 1), 0, pdl=True)


def kernel_spec(package: str) -> KernelSpec:
    """The selection kernel's spec (op ``moe_gate``, not an op of the op table: ``hwprofile.ops.moe_gate`` looks it up)."""
    return KernelSpec(
        OP, package, SOURCE, (INSTANCE,), plan_gate,
        doc=f"hwp90_moe_gate: grouped top-k selection of ops.moe_gate after the router GEMM, M <= {MAX_M}, N <= {MAX_N} (PDL)",
    )
