"""Cross-rank agreement over real gloo process groups: 4 CPU processes with simulated devices.

One launch of 4 ranks (tests/distributed/distributed_worker.py) runs every scenario in turn; each test reads
what every rank returned or raised. The bring-up command runs under torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.ranks import run_ranks

pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[2]
WORLD = 4
ROUTER = "setting.router_gemm.max_tokens"
ENGINE = "myengine-hwprofile " + metadata.version("myengine-hwprofile")  # the example downstream plugin as installed


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWPROFILE_", "PYTEST_"))}
    env.update(
        HWPROFILE_DEVICE="h200",
        HWPROFILE_CACHE_DIR=os.environ["HWPROFILE_CACHE_DIR"],
        HWPROFILE_CONFIG_DIR=os.environ["HWPROFILE_CONFIG_DIR"],
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    out = tmp_path_factory.mktemp("agreement")
    store = out / "store"
    t0 = time.monotonic()
    run_ranks(REPO / "tests" / "distributed" / "distributed_worker.py", lambda r: (str(r), str(WORLD), str(store), str(out)),
              lambda r: _env(LOCAL_RANK=str(r)), WORLD, 240)
    return out, time.monotonic() - t0


def results(ranks: tuple[Path, float], name: str, which: range | tuple[int, ...] = range(WORLD)) -> list[dict[str, Any]]:
    out = ranks[0]
    res = [json.loads((out / f"{name}.{r}.json").read_text()) for r in which]
    for r in res:
        assert "unexpected" not in r, r["unexpected"]
    return res


def diff(res: dict[str, Any], key: str) -> dict[str, list[int]]:
    return next(d["values"] for d in res["differences"] if d["key"] == key)


def test_agreement_costs_one_gather(ranks: tuple[Path, float]) -> None:
    res = results(ranks, "agree")
    assert all(r["ok"] and r["size"] == WORLD and not r["gathered"] for r in res)
    assert len({r["describe"] for r in res}) == 1 and "4 ranks on 1 host agree on NVIDIA H200 (sm_90)" in res[0]["describe"]
    assert [x["rank"] for x in res[0]["ranks"]] == [0, 1, 2, 3] and [x["local_rank"] for x in res[0]["ranks"]] == [0, 1, 2, 3]
    assert "fingerprint" in res[0]["table"] and res[0]["table"].count("NVIDIA H200 (sm_90)  sm90") == WORLD


def test_gather_reports_every_rank(ranks: tuple[Path, float]) -> None:
    res = results(ranks, "agree_gather")
    assert all(r["ok"] and r["gathered"] for r in res)


def test_env_override_on_one_rank(ranks: tuple[Path, float]) -> None:
    res = results(ranks, "env_override")
    assert not any(r["ok"] for r in res)  # every rank raises, with the same verdict
    assert len({r["error"] for r in res}) == 1
    assert [d["key"] for d in res[0]["differences"]] == [ROUTER]
    assert diff(res[0], ROUTER) == {"8": [0, 1, 3], "4": [2]}
    assert "HWPROFILE_ROUTER_GEMM_MAX_TOKENS" in res[0]["error"] and "rank 2 (host " in res[0]["error"]


def test_tuned_file_on_one_rank(ranks: tuple[Path, float]) -> None:
    res = results(ranks, "tuned_file")
    assert not any(r["ok"] for r in res)
    assert [d["key"] for d in res[0]["differences"]] == [ROUTER] and diff(res[0], ROUTER) == {"8": [0, 2, 3], "12": [1]}
    assert "tuned: tuned file" in res[0]["error"]


def test_newer_plugin_on_one_rank(ranks: tuple[Path, float]) -> None:
    res = results(ranks, "plugin_version")
    assert not any(r["ok"] for r in res)
    assert [d["key"] for d in res[0]["differences"]] == ["plugin.myengine"]
    assert diff(res[0], "plugin.myengine") == {ENGINE: [0, 1, 2], "myengine-hwprofile 99.0": [3]}


def test_blocked_plugin_on_one_rank(ranks: tuple[Path, float]) -> None:
    res = results(ranks, "blocked_plugin")
    assert not any(r["ok"] for r in res)
    assert diff(res[0], "plugin.myengine") == {ENGINE: [1, 2, 3], "(absent)": [0]}
    assert "HWPROFILE_DISABLE_PLUGINS=myengine" in res[0]["error"]


def test_mixed_models(ranks: tuple[Path, float]) -> None:
    err = results(ranks, "mixed_error")
    assert not any(r["ok"] for r in err)
    assert diff(err[0], "device.name") == {"NVIDIA H200": [0, 1], "NVIDIA GB300": [2, 3]} and "mixed='allow'" in err[0]["error"]
    ok = results(ranks, "mixed_allow")
    assert all(r["ok"] and r["gathered"] for r in ok)
    assert ok[0]["models"] == [["NVIDIA H200", "sm_90", [0, 1]], ["NVIDIA GB300", "sm_103", [2, 3]]]
    assert "accepted by mixed='allow'" in ok[0]["describe"]
    caught = results(ranks, "mixed_allow_override")
    assert not any(r["ok"] for r in caught) and diff(caught[0], ROUTER) == {"8": [2], "4": [3]}  # compared among the GB300 ranks


def test_each_rank_profiles_its_own_device(ranks: tuple[Path, float]) -> None:
    """HWPROFILE_DEVICE lists 4 GPUs; LOCAL_RANK picks each rank's own, as on a 4-GPU host before set_device."""
    (r0, *_) = results(ranks, "multi_gpu")
    assert [(x["device_index"], x["device_name"]) for x in r0["ranks"]] == [
        (0, "NVIDIA H200"),
        (1, "NVIDIA GB300"),
        (2, "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
        (3, "NVIDIA GB10"),
    ]


def test_subgroup(ranks: tuple[Path, float]) -> None:
    res = results(ranks, "subgroup")
    assert all(r["ok"] and r["size"] == 2 for r in res[:2])
    assert all(not r["ok"] and "is not a member of the group" in r["error"] for r in res[2:])


def test_rank_that_never_calls_is_a_timeout_naming_it(ranks: tuple[Path, float]) -> None:
    (r0,) = results(ranks, "timeout", (0,))
    assert not r0["ok"] and r0["missing"] == [1]
    assert "rank 1 had not called check_agreement (rank 0 had)" in r0["error"] and "(timeout=2 s)" in r0["error"]
    assert 2.0 <= r0["seconds"] < 2.0 + 3.0  # the timeout, slack for 2 shared cores (no grace: arrivals are marked on arrival)
    assert ranks[1] < 200


# --- the bring-up command -------------------------------------------------------------------------------


def torchrun(*args: str, sim: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "hwprofile.distributed", *args]
    return subprocess.run(cmd, env=_env(HWPROFILE_DEVICE=sim), capture_output=True, text=True, timeout=240)


def test_bringup_command_prints_the_table_and_accepts_allowed_models() -> None:
    p = torchrun("--mixed", "allow", "--timeout", "60", sim="h200,gb300")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 ranks on 1 host agree apart from their GPU models" in p.stdout
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("0 ", "1 "))]
    assert "cuda:0" in lines[0] and "NVIDIA H200" in lines[0] and "cuda:1" in lines[1] and "NVIDIA GB300" in lines[1]


def test_bringup_command_fails_on_disagreement() -> None:
    p = torchrun("--timeout", "60", sim="h200,gb300")
    assert p.returncode != 0
    assert "device.name" in p.stderr and "do not agree" in p.stderr and p.stderr.count("do not agree") == 1  # rank 0 reports once
    assert "NVIDIA GB300" in p.stdout  # the per-rank table


def test_bringup_command_needs_no_numpy(tmp_path: Path) -> None:
    """torch does not require numpy, and its object collectives fail without it: the details gather must not use them."""
    shadow = tmp_path / "numpy"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError('numpy hidden by the test', name='numpy')\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "hwprofile.distributed"]
    env = _env(HWPROFILE_DEVICE="h200,gb300")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    p = subprocess.run([*cmd, "--timeout", "60"], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 1, p.stdout + p.stderr  # a disagreement, not a crash
    assert "Numpy is not available" not in p.stderr and "device.name" in p.stderr and "NVIDIA GB300" in p.stdout


def test_bringup_command_outside_torchrun_says_how() -> None:
    env = {k: v for k, v in _env().items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([sys.executable, "-m", "hwprofile.distributed"], env=env, capture_output=True, text=True, timeout=60)
    assert (
        p.returncode == 2 and "not started by torchrun" in p.stderr and "torchrun --nproc-per-node N -m hwprofile.distributed" in p.stderr
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_bringup_started_by_hand_with_a_rank_missing_ends_within_its_timeout(rank: int) -> None:
    """``RANK=r WORLD_SIZE=2 ... python -m hwprofile.distributed --timeout 2`` without the other rank: a clear message after ~2 s."""
    import re
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "hwprofile.distributed", "--timeout", "2"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"hwprofile.distributed: rank {rank}: error: " in p.stderr and "--timeout 2 s" in p.stderr and "Start every rank" in p.stderr
    assert "Traceback" not in p.stderr and "Exception raised from" not in p.stderr and "DistStoreError" not in p.stderr, p.stderr
    if rank == 0:
        waited = float(re.search(r"waited ([0-9.]+) s", p.stderr).group(1))  # type: ignore[union-attr]
        assert 1.5 <= waited < 4.5, p.stderr
    assert took < 25  # the interpreter and torch start, then about the timeout (it was 33 s and a traceback)
