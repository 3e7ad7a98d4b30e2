"""check_agreement over NCCL on two real GPUs: agreement, a forced disagreement, and the bring-up command.

Needs two GPUs that torch can use; skips otherwise (CI, one-GPU machines). Ran on two H200s
(benchmarks/RESULTS.md has the run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    import hwprofile
    from hwprofile import distributed as hd
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    out = {}
    a = hd.check_agreement(timeout=60)
    out["agree"] = {"ok": True, "digest": a.digest, "devices": [r.device_index for r in a.ranks], "gathered": a.gathered}
    if rank == 1:
        os.environ["HWPROFILE_ROUTER_GEMM_MAX_TOKENS"] = "3"
    hwprofile.reset()
    try:
        hd.check_agreement(timeout=60)
        out["disagree"] = {"ok": True}
    except hwprofile.AgreementError as exc:
        out["disagree"] = {"ok": False, "keys": [d.key for d in exc.differences], "values": exc.differences[0].values()}
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(sys.argv[1], f"{rank}.json"), "w") as f:
        json.dump(out, f, default=list)
""")


def _two_gpus() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs for NCCL; torch sees {torch.cuda.device_count()}")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        HWPROFILE_CACHE_DIR=os.environ["HWPROFILE_CACHE_DIR"],
    )
    return env


@pytest.mark.hwprofile_gpu
def test_nccl_agreement_and_forced_disagreement(tmp_path: Path) -> None:
    _two_gpus()
    script = tmp_path / "nccl_ranks.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    assert r0["agree"]["ok"] and r0["agree"]["devices"] == [0, 1] and r0["agree"]["digest"] == r1["agree"]["digest"]
    for r in (r0, r1):
        assert not r["disagree"]["ok"] and r["disagree"]["keys"] == ["setting.router_gemm.max_tokens"]
        assert r["disagree"]["values"]["3"] == [1]


@pytest.mark.hwprofile_gpu
def test_nccl_bringup_command() -> None:
    _two_gpus()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "hwprofile.distributed",
        "--backend",
        "nccl",
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 ranks on 1 host agree" in p.stdout and "cuda:1" in p.stdout
