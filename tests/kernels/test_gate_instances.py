"""Every fused-gate instance a served router plans compiles, without a spill, for each plugin's target (NVRTC; no GPU).

``hwprofile compile`` pre-builds only DeepSeek-V3's and Kimi-K2's instances (N = 256 and 384: the MAX_N buckets 256
and 512); the routers of 64, 128 and 160 experts plan the 64 and 128 buckets and other tilings, which nothing else
compiles before a GPU first runs them.
"""

from __future__ import annotations

import pytest

from hwprofile.optable import MOE_GATE
from hwprofile.plugin import profile_for, simulated_device

from .spills import known_spills


# sm100 builds the same header on the same family as sm120, against the same static-shared limit
@pytest.mark.parametrize("cc", [(9, 0), (12, 0)], ids=["sm90", "sm120"])
def test_every_served_routers_gate_instance_builds_without_spills(cc: tuple[int, int]) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from hwprofile.kernels import _pipeline as jit

    prof = profile_for(simulated_device(cc))
    spec = prof.kernels[MOE_GATE.name]
    exprs = sorted({
        spec.configure(m=m, n=r.n, k=r.k, split_k=split, n_group=r.n_group, topk_group=r.topk_group, top_k=r.top_k).name_expression
        for r in MOE_GATE.routers for m in range(1, 17) for split in (True, False)
    })
    assert {e.rsplit(", ", 1)[1].rstrip(">") for e in exprs} == {"64", "128", "256", "512"}  # every MAX_N bucket
    assert prof.target is not None
    c = jit.compile_spec(spec, prof.target, tuple(exprs))
    assert c.cubin[:4] == b"\x7fELF"
    from hwprofile.kernels import toolchain

    allowed = known_spills(toolchain.nvrtc_version()).get((prof.target, MOE_GATE.name), 0)
    assert (c.spill_bytes or 0) <= allowed, f"{len(exprs)} instances spill {c.spill_bytes} B on {prof.target}"
