"""One rank of test_faults.py's store-gone case: rank 0 hosts the store (init_process_group without torchrun) and
leaves right after raising; every other rank calls check_agreement and writes what it raised.

``python store_gone_worker.py RANK WORLD PORT OUTDIR`` writes ``OUTDIR/store_gone.<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

RANK, WORLD, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])

import torch.distributed as dist  # noqa: E402

import hwprofile  # noqa: E402
from hwprofile import distributed as hd  # noqa: E402
from hwprofile.errors import AgreementError  # noqa: E402


def main() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD, timeout=timedelta(seconds=5))
    # every rank through bring-up before rank 0 leaves: gloo's connection setup still reads the store after rank 0's
    # init_process_group returns, and a rank cut off there fails inside torch, before hwprofile is called (a race
    # seen under load on 2026-12-06)
    dist.barrier()
    hwprofile.reset()
    if RANK == 0:
        try:
            raise RuntimeError("the model failed to load on rank 0")
        except RuntimeError as exc:
            (OUT / "store_gone.0.json").write_text(json.dumps({"raised": str(exc)}))
        sys.stdout.flush()
        time.sleep(0.2)  # the barrier's last messages delivered
        os._exit(0)  # an engine's rank 0 that raised and exited: its TCPStore goes with it
    time.sleep(1.0)  # rank 0 is gone by now
    t0 = time.monotonic()
    try:
        hd.check_agreement(timeout=20)
        out: dict[str, object] = {"ok": True}
    except AgreementError as exc:
        out = {"ok": False, "error": str(exc), "missing": list(exc.missing), "seconds": time.monotonic() - t0}
    except Exception as exc:  # noqa: BLE001 - what the test must never see
        out = {"ok": False, "unexpected": f"{type(exc).__name__}: {exc}"}
    (OUT / f"store_gone.{RANK}.json").write_text(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
