"""One "host" of a fleet, run as its own process by tests/fleet: compiles a kernel or tunes, then prints what it did.

    python worker.py compile SITE INCLUDE      compile the toy kernel (real NVRTC) through the cache layers and the store
    python worker.py compile-hold SITE INCLUDE like compile, but block forever inside NVRTC (the fleet's compile lock
                                               held; the test kills it)
    python worker.py tune                      tune router_gemm on a cold host (no tuned file; HWPROFILE_DEVICE) with a fake timer
    python worker.py hold                      like tune, but block forever while measuring (the test kills it)

Environment: HWPROFILE_REMOTE, HWPROFILE_CACHE_DIR / HWPROFILE_CONFIG_DIR of this "host"; FLEET_START_AT (epoch
seconds to start at, so that many workers start together); FLEET_LOCK_TTL (the fleet lock's ttl, seconds);
FLEET_READY (a file written once the fleet lock is held, for ``hold``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

EXPR = "scale_kernel<2>"


def main() -> None:
    import hwprofile
    from hwprofile import _remote

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    if os.environ.get("FLEET_LOCK_TTL"):
        _remote.LOCK_TTL_S = float(os.environ["FLEET_LOCK_TTL"])
    start = float(os.environ.get("FLEET_START_AT", "0"))
    mode = sys.argv[1]
    out: dict[str, object] = {}
    if mode in ("compile", "compile-hold"):
        from hwprofile.kernels import _pipeline, toolchain
        from hwprofile.kernels.spec import KernelSpec, Launch

        if mode == "compile-hold":

            def hold(*args: object, **kwargs: object) -> object:
                Path(os.environ["FLEET_READY"]).write_text("holding")
                time.sleep(3600)
                raise AssertionError("killed before")

            toolchain.nvrtc_compile = hold  # type: ignore[assignment]

        sys.path.insert(0, sys.argv[2])
        spec = KernelSpec("toy", "toy_layer_kernels", "k.cu", (EXPR,), lambda **kw: Launch(EXPR, (1, 1, 1), (32, 1, 1)),
                          options=(f"-I{sys.argv[3]}",), plugin="toy", distribution_version="toy 1.0")
        time.sleep(max(0.0, start - time.time()))
        t0 = time.monotonic()
        c = _pipeline.compile_spec(spec, "sm_90a")
        out = {"key": c.key, "layer": c.layer, "cubin": len(c.cubin), "pipeline": _pipeline.counters(), "seconds": time.monotonic() - t0}
    else:
        from tests.tune.helpers import FakeTimer

        class Timer(FakeTimer):
            def measure(self, op: str, m: int, n: int, k: int):  # type: ignore[no-untyped-def]
                if mode == "hold":
                    Path(os.environ["FLEET_READY"]).write_text("holding")
                    time.sleep(3600)
                time.sleep(0.005)  # long enough that cold hosts overlap
                return super().measure(op, m, n, k)

        timer = Timer()
        time.sleep(max(0.0, start - time.time()))
        t0 = time.monotonic()
        result = hwprofile.tune(0, timer=timer, ops=["router_gemm"], lock_timeout=float(os.environ.get("FLEET_LOCK_WAIT", "60")))
        prof = hwprofile.profile(0)
        out = {"measured": len(timer.calls), "skipped": result.skipped, "seconds": time.monotonic() - t0,
               "source": prof.explain("router_gemm.model").winner.source}
    out["remote"] = _remote.counters()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
