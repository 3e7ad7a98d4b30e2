"""The sm90 fused MoE gate of ``hwprofile.ops.moe_gate`` (``kernels/moe_gate.cu``): router GEMM and selection in one launch.

The GEMM half is ``hwp90::router`` of ``kernels/sm90_gemv.cu`` with the router GEMM's own tiling
(:func:`hwprofile_sm90.planning.router_tiles`: split-K over a cluster, L2 prefetch, PDL), so the
gate's GEMM costs what the measured router kernel costs; the CTA that stores its logits last selects
the experts of every token (``hwprofile/moe_gate.cuh``). The bounds are the shared selection's
(``hwprofile.plugin.check_gate_shape``). Pure, so the plan is tested on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hwprofile.plugin import ArchTuning, KernelSpec, Launch, Planner, check_gate_shape

from .planning import SM_COUNT, TUNING, router_tiles

if TYPE_CHECKING:
    from hwprofile.plugin import DeviceInfo

SOURCE = "kernels/moe_gate.cu"
OP = "moe_gate"
#: the routers whose instances `hwprofile compile` pre-builds: (N, K) of DeepSeek-V3 and Kimi-K2, at M <= 8 and M <= 16
PREBUILT = ((256, 7168), (384, 7168))


def _b(v: bool) -> str:
    return "true" if v else "false"


def plan_gate(
    *, m: int, n: int, k: int, split_k: bool, n_group: int = 1, topk_group: int = 1, top_k: int = 1, sm_count: int = SM_COUNT
) -> Launch:
    """The fused gate's launch (the router GEMM's grid and block, PDL); a ValueError names the bound a call breaks."""
    max_n = check_gate_shape(m=m, n=n, k=k, n_group=n_group, topk_group=topk_group, top_k=top_k, what="sm90 moe_gate kernel")
    mt, warps, nt, ksplit, unroll, pf, minb, groups = router_tiles(m=m, n=n, k=k, split_k=split_k, sm_count=sm_count)
    expr = f"hwp90_moe_gate<{mt}, {warps}, {nt}, {ksplit}, {unroll}, {_b(pf)}, {minb}, {max_n}>"
    return Launch(expr, (groups, ksplit, 1), (warps * 32, 1, 1), 0, pdl=True)


def _plan_for(t: ArchTuning, **shape: int) -> Launch:
    return plan_gate(sm_count=t.sm_count, **shape)  # type: ignore[arg-type]


def kernel_spec(package: str, device: DeviceInfo | None = None) -> KernelSpec:
    """The fused gate's spec (op ``moe_gate`` of the op table's gate kind), planned for ``device``'s SM count.

    ``kernels/moe_gate.cu`` includes ``sm90_gemv.cu`` (the router GEMM, unchanged), so the plugin's
    kernel directory is on the include path; the source digest covers the included file's content.
    """
    configure = Planner(_plan_for, TUNING, device)
    pre = configure.prebuild()
    instances = tuple(dict.fromkeys(pre(m=m, n=n, k=k, split_k=True).name_expression for n, k in PREBUILT for m in (1, 16)))
    kernels = Path(__file__).parent / "kernels"
    return KernelSpec(
        OP, package, SOURCE, instances, configure, options=(f"-I{kernels}",),
        doc="hwp90_moe_gate: router GEMM + grouped top-k selection of ops.moe_gate in one launch, M <= 16, N <= 512 (PDL)",
    )
