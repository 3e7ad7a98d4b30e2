"""Serving scenarios, each run in a fresh process (CUDA, cuBLAS and hwprofile untouched): what the GPU tests
assert and ``benchmarks/serving_h200.py`` times. Run as ``python -m tests.serving.scenarios NAME``; prints one
JSON line. Needs an sm_90 GPU.

* ``warmed_capture``: warm up an engine step's shapes, then capture a step that also calls a never-seen
  shape of each path (one the kernel would take, one the fallback takes), replay it, check the results;
* ``unwarmed_capture``: no warm-up; the first call inside a capture is the clear error, the capture ends
  cleanly and the device keeps working;
* ``first_call``: ``profile()`` and a first op call, timed (the cache state is the caller's).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

STEP = {"gemv": [(1, 4096, 4096)], "router_gemm": [(8, 256, 7168)]}
NEVER_SEEN_KERNEL = (1, 2048, 4096)  # gemv routes it to its kernel on sm90, warm-up never saw it
NEVER_SEEN_FALLBACK = (1, 8192, 4096)  # gemv: N outside the kernel's region


def _operands(torch: Any, m: int, n: int, k: int) -> tuple[Any, Any]:
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n + k)
    return (torch.randn((m, k), device="cuda", generator=g).bfloat16(), torch.randn((n, k), device="cuda", generator=g).bfloat16())


def warmed_capture() -> dict[str, Any]:
    import torch

    import hwprofile
    from hwprofile import ops

    t0 = time.perf_counter()
    report = ops.warmup(shapes=STEP)
    warm_s = time.perf_counter() - t0
    hwprofile.kernels.forbid_compile()
    xs = {
        "step_gemv": _operands(torch, *STEP["gemv"][0]),
        "step_router": _operands(torch, *STEP["router_gemm"][0]),
        "new_kernel_shape": _operands(torch, *NEVER_SEEN_KERNEL),
        "new_fallback_shape": _operands(torch, *NEVER_SEEN_FALLBACK),
    }
    fns = {"step_router": ops.router_gemm}
    outs: dict[str, Any] = {}
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        t1 = time.perf_counter()
        with torch.cuda.graph(g, stream=stream):
            for name, (x, w) in xs.items():
                outs[name] = fns.get(name, ops.gemv)(x, w)
        capture_s = time.perf_counter() - t1
    torch.cuda.current_stream().wait_stream(stream)
    g.replay()
    torch.cuda.synchronize()
    errors = {}
    for name, (x, w) in xs.items():
        ref = x.double() @ w.double().t()
        errors[name] = float((outs[name].double() - ref).norm() / ref.norm())
    stats = hwprofile.profile().stats.as_dict()
    return {"warmup_s": warm_s, "capture_s": capture_s, "loaded": report.loaded, "fallbacks": report.fallbacks,
            "rel_errors": errors, "stats": stats}


def unwarmed_capture() -> dict[str, Any]:
    import torch

    import hwprofile
    from hwprofile import ops

    hwprofile.profile()
    x, w = _operands(torch, *STEP["gemv"][0])
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    error = ""
    with torch.cuda.stream(stream):
        try:
            with torch.cuda.graph(g, stream=stream):
                ops.gemv(x, w)
        except ops.NotWarmedError as exc:
            error = str(exc)
    torch.cuda.synchronize()
    after = ops.gemv(x, w)  # the device still works, eagerly: the kernel loads now
    torch.cuda.synchronize()
    ref = x.double() @ w.double().t()
    return {"error": error, "rel_error_after": float((after.double() - ref).norm() / ref.norm()),
            "stats": hwprofile.profile().stats.as_dict()}


def first_call() -> dict[str, Any]:
    t0 = time.perf_counter()
    import hwprofile

    prof = hwprofile.profile()
    t1 = time.perf_counter()
    import torch

    from hwprofile import ops

    x, w = _operands(torch, *STEP["gemv"][0])
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    ops.gemv(x, w)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    return {"profile_s": t1 - t0, "first_call_s": t3 - t2, "stats": prof.stats.as_dict()}


SCENARIOS = {f.__name__: f for f in (warmed_capture, unwarmed_capture, first_call)}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]]()))
