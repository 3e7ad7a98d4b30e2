"""One rank of the tune-across-ranks tests (test_ranks.py starts 2 of these over gloo, simulated H200s, a fake timer).

``python ranks_worker.py RANK WORLD STORE OUTDIR``: runs each scenario in turn, writing
``OUTDIR/<scenario>.<rank>.json`` with what tune() and check_agreement() returned or raised.
The late-rank scenario runs last: it leaves a collective in flight.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RANK, WORLD, STORE, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])

import torch.distributed as dist  # noqa: E402

import hwprofile  # noqa: E402
from hwprofile import distributed as hd  # noqa: E402
from hwprofile import retune, tuning  # noqa: E402
from hwprofile.optable import TABLE  # noqa: E402
from tests.tune.helpers import SWEPT, FakeTimer, stale_tuned_file  # noqa: E402

BASE = dict(os.environ)


def scenario(config: Path, make_stale: bool, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    os.environ.clear()
    os.environ.update(BASE, HWPROFILE_CONFIG_DIR=str(config))
    config.mkdir(parents=True, exist_ok=True)
    hwprofile.reset()
    if make_stale and (RANK == 0 or "shared" not in config.name):
        stale_tuned_file(hwprofile.profile(0))
    dist.barrier()
    hwprofile.reset()
    t0 = time.perf_counter()
    try:
        out = body()
    except hwprofile.HwprofileError as exc:
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "unexpected": traceback.format_exc()}
    out["seconds"] = time.perf_counter() - t0
    return out


def tune_and_agree(timer: FakeTimer, ops: list[str] | None = None) -> dict[str, Any]:
    result = hwprofile.tune(0, timer=timer, timeout=60, ops=ops)
    prof = hwprofile.profile(0)
    files = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in result.written}
    agreement = hd.check_agreement(timeout=30)
    return {
        "ok": True, "calls": [list(c) for c in timer.calls], "files": files, "ranks": result.ranks, "measured": result.measured,
        "values": {k: prof[k] for op in TABLE for k in retune.decided_keys(op)}, "agree": agreement.describe(),
        "fingerprint": prof.fingerprint,
        "points": len(result.plan.points()), "stale_after": [f.op for f in retune.findings(prof) if f.status != "fresh"],
        "stamp_date": tuning.read_tuned(result.written[0])[0].date if result.written else "",
    }


def write(name: str, out: dict[str, Any]) -> None:
    (OUT / f"{name}.{RANK}.json").write_text(json.dumps(out))


def main() -> None:
    dist.init_process_group("gloo", init_method=f"file://{STORE}", rank=RANK, world_size=WORLD)
    write("shared", scenario(OUT / "config-shared", True, lambda: tune_and_agree(FakeTimer(wins_to=10))))
    write("own", scenario(OUT / f"config-own-{RANK}", True, lambda: tune_and_agree(FakeTimer(wins_to=6))))
    # only rank 1 has a stale file: both ranks measure (the union), both end with the same table
    write("one_stale", scenario(OUT / f"config-one-{RANK}", RANK == 1, lambda: tune_and_agree(FakeTimer(wins_to=9))))
    write("fail", scenario(OUT / f"config-fail-{RANK}", True,
                           lambda: tune_and_agree(FakeTimer(fail_after=3 if RANK == 1 else None))))
    # the ops sm90 ships swept: nothing stale among them (those it ships predicted are unmeasured: left out)
    write("nothing", scenario(OUT / f"config-nothing-{RANK}", False, lambda: tune_and_agree(FakeTimer(), ops=SWEPT)))

    def late() -> dict[str, Any]:
        if RANK == 1:
            time.sleep(6)  # never calls in time: rank 0 must give up on its own
            return {"ok": True}
        hwprofile.tune(0, timer=FakeTimer(), timeout=1.5)
        return {"ok": True}

    write("late", scenario(OUT / f"config-late-{RANK}", True, late))
    (OUT / f"done.{RANK}").write_text("ok")
    sys.stdout.flush()
    os._exit(0)  # the late scenario left a collective in flight; tearing the group down could wait on it


if __name__ == "__main__":
    main()
