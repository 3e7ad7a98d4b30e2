"""One rank of the agreement fault tests (test_faults.py starts 4 of these).

``python fault_worker.py RANK WORLD PORT OUTDIR``: joins a gloo group (rank 0 hosts the TCPStore, the
group's own timeout is ``PG_S``) and runs every scenario in order: each rank does its part (sleeps,
passes other arguments, never calls) and writes ``OUTDIR/<scenario>.<rank>.json`` with what
check_agreement returned or raised, then (where the scenario says) joins one all_reduce, the
engine's next collective, whose sum shows that nothing of hwprofile's paired with it. The crash
scenario runs last: rank 3 leaves the job there.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
PG_S = 3.0  # the process group's own timeout
T = 1.5  # check_agreement's timeout in the fault scenarios

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hwprofile  # noqa: E402
from hwprofile import distributed as hd  # noqa: E402


def result(fn: Callable[[], Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        a = fn()
    except hwprofile.AgreementError as exc:
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": str(exc), "missing": list(exc.missing),
                "keys": [d.key for d in exc.differences], "ranks": len(exc.ranks)}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}",
                "unexpected": traceback.format_exc()}
    return {"ok": True, "seconds": time.perf_counter() - t0, "describe": a.describe(), "size": a.size}


def engine_all_reduce() -> float:
    """The engine's next collective after the check: every rank adds rank + 1 (4 ranks: 10)."""
    t = torch.tensor([RANK + 1.0])
    try:
        dist.all_reduce(t, async_op=True).wait(timedelta(seconds=5))
    except Exception:  # noqa: BLE001 - a collective that paired with a stray one of hwprofile's
        return -1.0
    return float(t.item())


# name -> (kwargs for every rank, {rank: its own kwargs}, {rank: seconds to sleep before calling}, whether an all_reduce follows)
SCENARIOS: list[tuple[str, dict[str, Any], dict[int, dict[str, Any]], dict[int, float], bool]] = [
    ("agree_inf", {"timeout": math.inf}, {}, {}, True),
    ("long_timeout", {"timeout": PG_S + 5}, {}, {3: PG_S + 1}, True),  # longer than the group's own timeout: honoured
    ("late", {"timeout": T}, {}, {1: T + 1.0}, False),
    ("args_mixed", {"timeout": T}, {1: {"mixed": "allow"}}, {}, True),
    ("args_gather", {"timeout": T}, {2: {"gather": True}}, {}, True),
    ("args_timeout", {"timeout": T}, {3: {"timeout": 2 * T}}, {}, True),
    ("bad_timeout", {"timeout": T}, {0: {"timeout": -1}}, {}, True),
    ("profile_fails", {"timeout": T}, {2: {"device": 9}}, {}, True),
    ("crashed", {"timeout": 2.5}, {}, {2: 1.5}, False),  # rank 3 never calls; rank 2 arrives late but in time
]


def main() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD, timeout=timedelta(seconds=PG_S))
    hwprofile.reset()
    for name, common, per_rank, sleeps, reduce in SCENARIOS:
        if name == "crashed" and RANK == 3:
            sys.stdout.flush()
            os._exit(0)  # a rank that crashed before the check (exit 0: nothing else notices)
        time.sleep(sleeps.get(RANK, 0.0))
        kwargs = {**common, **per_rank.get(RANK, {})}
        out = result(lambda: hd.check_agreement(**kwargs))  # noqa: B023 - called at once
        if reduce:
            out["all_reduce"] = engine_all_reduce()
        (OUT / f"{name}.{RANK}.json").write_text(json.dumps(out))
    (OUT / f"done.{RANK}").write_text("ok")
    if RANK == 0:  # rank 0 hosts the store: stay until the others are through with it
        end = time.monotonic() + 30
        while time.monotonic() < end and not all((OUT / f"done.{r}").exists() for r in range(1, WORLD - 1)):
            time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)  # a rank is gone: tearing the group down could wait on it


if __name__ == "__main__":
    main()
