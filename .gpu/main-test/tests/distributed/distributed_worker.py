"""One rank of the gloo agreement tests (test_gloo.py starts 4 of these).

``python distributed_worker.py RANK WORLD STORE OUTDIR``: joins a gloo group through a FileStore and
runs every scenario in order, each from the same base environment plus the scenario's changes for
this rank, and writes ``OUTDIR/<scenario>.<rank>.json`` with what check_agreement returned or raised.
The timeout scenario runs last: it leaves its subgroup with a collective in flight.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RANK, WORLD, STORE, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
TIMEOUT_S = 2.0

import torch.distributed as dist  # noqa: E402

import hwprofile  # noqa: E402
from hwprofile import distributed as hd  # noqa: E402

BASE = dict(os.environ)


def fake_newer_downstream() -> dict[str, str]:
    """A site directory where myengine-hwprofile claims version 99.0 (the same module): a node upgraded alone."""
    d = OUT / f"site-{RANK}"
    info = d / "myengine_hwprofile-99.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myengine-hwprofile\nVersion: 99.0\n\n")
    (info / "entry_points.txt").write_text("[hwprofile.plugins]\nmyengine = myengine_hwprofile\n")
    sys.path.insert(0, str(d))
    return {}


def tuned_file() -> dict[str, str]:
    """A fresh tuned file (stamped against what runs here) that sets router_gemm.max_tokens = 12."""
    from tests.conftest import tuned_toml  # the unit tests' helper (the test puts the repository on PYTHONPATH)

    prof = hwprofile.profile(0)
    assert prof.plugin is not None
    kernel = prof.kernels["router_gemm"].source_digest()
    f = OUT / f"tuned-{RANK}.toml"
    f.write_text(
        tuned_toml(prof.device, {"router_gemm.max_tokens": 12}, plugin=prof.plugin.name, version=prof.plugin.version or "", kernel=kernel)
    )
    return {"HWPROFILE_TUNED_FILE": str(f)}


MIXED4 = {"HWPROFILE_DEVICE": "h200,h200,gb300,gb300"}

# name -> (env for every rank, {rank: extra env or a function returning it}, check_agreement kwargs)
SCENARIOS: dict[str, tuple[dict[str, str], dict[int, Any], dict[str, Any]]] = {
    "agree": ({}, {}, {}),
    "agree_gather": ({}, {}, {"gather": True}),
    "env_override": ({}, {2: {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "4"}}, {}),
    "tuned_file": ({}, {1: tuned_file}, {}),
    "plugin_version": ({}, {3: fake_newer_downstream}, {}),
    "blocked_plugin": ({}, {0: {"HWPROFILE_DISABLE_PLUGINS": "myengine"}}, {}),
    "mixed_error": (MIXED4, {}, {}),
    "mixed_allow": (MIXED4, {}, {"mixed": "allow"}),
    "mixed_allow_override": (MIXED4, {3: {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "4"}}, {"mixed": "allow"}),
    "multi_gpu": ({"HWPROFILE_DEVICE": "h200,gb300,rtx-pro-6000,dgx-spark"}, {}, {"mixed": "allow", "gather": True}),
}


def result(fn: Callable[[], Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        a = fn()
    except hwprofile.AgreementError as exc:
        return {
            "ok": False,
            "seconds": time.perf_counter() - t0,
            "error": str(exc),
            "missing": list(exc.missing),
            "differences": [
                {
                    "key": d.key,
                    "values": {h.value: list(h.ranks) for h in d.holdings},
                    "sources": {h.value: list(h.sources) for h in d.holdings},
                }
                for d in exc.differences
            ],
        }
    except hwprofile.HwprofileError as exc:
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {
            "ok": False,
            "seconds": time.perf_counter() - t0,
            "error": f"{type(exc).__name__}: {exc}",
            "unexpected": traceback.format_exc(),
        }
    return {
        "ok": True,
        "seconds": time.perf_counter() - t0,
        "gathered": a.gathered,
        "size": a.size,
        "describe": a.describe(),
        "table": a.table(),
        "models": [[n, sm, list(r)] for (n, sm), r in a.models.items()],
        "ranks": [
            {
                "rank": r.rank,
                "device_index": r.device_index,
                "device_name": r.device_name,
                "host": r.host,
                "local_rank": r.local_rank,
                "fingerprint": r.fingerprint,
            }
            for r in a.ranks
        ],
    }


def run(name: str) -> None:
    common, per_rank, kwargs = SCENARIOS[name]
    os.environ.clear()
    os.environ.update(BASE)
    os.environ.update(common)
    saved_path = list(sys.path)
    hwprofile.reset()
    extra = per_rank.get(RANK, {})
    if callable(extra):
        extra = extra()
    os.environ.update(extra)
    hwprofile.reset()
    out = result(lambda: hd.check_agreement(timeout=30, **kwargs))
    (OUT / f"{name}.{RANK}.json").write_text(json.dumps(out))
    sys.path[:] = saved_path


def main() -> None:
    dist.init_process_group("gloo", init_method=f"file://{STORE}", rank=RANK, world_size=WORLD)
    names = [n for n in sys.argv[5].split(",") if n] if len(sys.argv) > 5 else list(SCENARIOS)
    for name in names:
        run(name)
    # a subgroup of ranks 0 and 1 (every rank must create it), checked twice: once by both, once without rank 1
    pair = dist.new_group([0, 1])
    os.environ.clear()
    os.environ.update(BASE)
    hwprofile.reset()
    out = result(lambda: hd.check_agreement(pair, timeout=30))  # ranks 2 and 3 are not members: an error at once
    (OUT / f"subgroup.{RANK}.json").write_text(json.dumps(out))
    if RANK == 0:
        out = result(lambda: hd.check_agreement(pair, timeout=TIMEOUT_S))
        (OUT / f"timeout.{RANK}.json").write_text(json.dumps(out))
    elif RANK == 1:
        time.sleep(TIMEOUT_S + 4)  # never calls: rank 0 must give up on its own
    (OUT / f"done.{RANK}").write_text("ok")
    sys.stdout.flush()
    os._exit(0)  # the pair has a collective in flight; tearing the group down could wait on it


if __name__ == "__main__":
    main()
