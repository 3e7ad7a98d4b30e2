"""Ranks alike: 2 gloo ranks (simulated H200s, a fake timer) split the points, exchange them and end with one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.ranks import run_ranks

pytest.importorskip("torch.distributed")

import hwprofile
from hwprofile import retune, sweep
from hwprofile.optable import TABLE

from .helpers import PREDICTED, SWEPT, FakeTimer, shipped

REPO = Path(__file__).resolve().parents[2]
WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tune-ranks")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWPROFILE_", "PYTEST_"))}
    env.update(
        HWPROFILE_DEVICE="h200", HWPROFILE_DISABLE_PLUGINS="myengine", HWPROFILE_CACHE_DIR=os.environ["HWPROFILE_CACHE_DIR"],
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep), OMP_NUM_THREADS="1",
    )
    run_ranks(REPO / "tests" / "tune" / "ranks_worker.py", lambda r: (str(r), str(WORLD), str(out / "store"), str(out)),
              lambda r: {**env, "LOCAL_RANK": str(r)}, WORLD, 240)
    return out


def results(out: Path, name: str) -> list[dict[str, Any]]:
    res = [json.loads((out / f"{name}.{r}.json").read_text()) for r in range(WORLD)]
    for r in res:
        assert "unexpected" not in r, r["unexpected"]
    return res


def _split_and_agreed(res: list[dict[str, Any]], wins_to: int) -> None:
    """Both ranks measured their share of the stale router_gemm's and the unmeasured (predicted) ops' grids, and
    both apply what one sweep of those points with ``FakeTimer(wins_to)`` decides."""
    assert all(r["ok"] for r in res), [r.get("error") for r in res]
    needed = [op for op in TABLE if op == "router_gemm" or op in PREDICTED]
    points = [(op, *g) for op in needed for g in sweep.default_grid(op)]  # catalog shapes and box edges, as sweep measures
    calls = [{tuple(c) for c in r["calls"]} for r in res]
    assert calls[0] and calls[1] and not calls[0] & calls[1]  # each rank measured its own share
    assert calls[0] | calls[1] == set(points) and res[0]["points"] == len(points)  # together: those grids, once
    prof = hwprofile.profile(0)  # a simulated H200 here too (conftest): the same plan, the same split
    assert [set(s) for s in retune.split(points, WORLD, retune.bandwidth(prof.device))] == calls  # balanced by estimated cost
    want: dict[str, Any] = {}
    for op in TABLE:
        if op in needed:
            want.update(sweep.run(prof, op, sweep.default_grid(op), FakeTimer(wins_to=wins_to), box=sweep.box_grid(op))["thresholds"])
        else:  # fresh: what sm90 ships
            want.update({k: shipped(k) for k in retune.decided_keys(op)})
    assert all(r["values"] == want for r in res) and len({r["fingerprint"] for r in res}) == 1
    assert all("2 ranks on 1 host agree" in r["agree"] for r in res)  # check_agreement holds after
    assert all(r["stale_after"] == [] for r in res) and len({r["stamp_date"] for r in res}) == 1


def test_ranks_sharing_a_config_directory_split_the_points_and_agree(ranks: Path) -> None:
    res = results(ranks, "shared")
    _split_and_agreed(res, 10)
    assert res[0]["files"] == res[1]["files"]  # the same file, the same bytes


def test_ranks_with_their_own_config_directories_write_the_same_table(ranks: Path) -> None:
    res = results(ranks, "own")
    _split_and_agreed(res, 6)
    (f0, h0), (f1, h1) = (next(iter(r["files"].items())) for r in res)
    assert f0 != f1 and h0 == h1  # two files, byte for byte the same


def test_a_stale_value_on_one_rank_is_re_measured_by_both(ranks: Path) -> None:
    _split_and_agreed(results(ranks, "one_stale"), 9)


def test_a_rank_that_fails_makes_every_rank_raise_the_same_error(ranks: Path) -> None:
    res = results(ranks, "fail")
    assert not any(r["ok"] for r in res) and len({r["error"] for r in res}) == 1
    assert "measuring failed on 1 of 2 ranks (rank 1: measuring on device 0 failed: RuntimeError: fake kernel failure" in res[0]["error"]
    assert res[0]["error"].endswith("no tuned file was changed")


def test_nothing_stale_measures_nothing_on_any_rank(ranks: Path) -> None:
    res = results(ranks, "nothing")
    assert all(r["ok"] and r["calls"] == [] and r["files"] == {} for r in res)


def test_a_rank_that_never_comes_is_an_error_within_the_bound(ranks: Path) -> None:
    res = results(ranks, "late")
    assert not res[0]["ok"] and "the 2 ranks could not exchange their devices within 1.5 s" in res[0]["error"]
    assert res[0]["seconds"] < 10


def _torchrun(tmp_path: Path, stale: bool, args: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess[str]]:
    """`hwprofile tune` on 2 ranks as torchrun starts them (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT): gloo here."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWPROFILE_", "PYTEST_"))}
    env.update(
        HWPROFILE_DEVICE="h200,h200", HWPROFILE_DISABLE_PLUGINS="myengine", HWPROFILE_CACHE_DIR=os.environ["HWPROFILE_CACHE_DIR"],
        HWPROFILE_CONFIG_DIR=str(config), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep), OMP_NUM_THREADS="1",
    )
    if stale:
        code = (
            "import hwprofile; from tests.tune.helpers import stale_tuned_file; stale_tuned_file(hwprofile.profile(0))"
        )
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", f"import sys; from hwprofile.cli import main; sys.exit(main(['tune', *{list(args)!r}]))"],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(WORLD)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def test_the_command_under_torchrun_tunes_each_rank_s_device(tmp_path: Path) -> None:
    res = _torchrun(tmp_path, stale=False, args=("--ops", ",".join(SWEPT)))  # sm90's predicted ops are unmeasured: left out
    assert [r.returncode for r in res] == [0, 0], [r.stderr for r in res]
    assert [r.stdout.strip() for r in res] == ["device 0: nothing stale", "device 1: nothing stale"]


def test_the_command_under_torchrun_fails_alike_on_every_rank(tmp_path: Path) -> None:
    res = _torchrun(tmp_path, stale=True)  # simulated devices: nothing can be timed
    assert [r.returncode for r in res] == [2, 2]
    errors = [r.stderr.strip().splitlines()[-1] for r in res]
    assert "tune measures real kernels" in errors[0] and "simulated" in errors[0], errors
