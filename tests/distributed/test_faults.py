"""Every exit of check_agreement is the same on every rank: 4 gloo ranks through the fault scenarios of fault_worker.py.

A late rank, ranks passing different or invalid arguments, a rank whose profile fails, a timeout
longer than the group's own or infinite, a rank that crashed: every rank returns the same
Agreement or raises the same kind of AgreementError naming what differed, within its timeout, and
the engine's next collective pairs with nothing of hwprofile's.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.ranks import run_ranks

pytest.importorskip("torch.distributed")

from tests.distributed.test_gloo import REPO, _env  # the same clean environment as the other gloo ranks

WORLD = 4
T = 1.5  # fault_worker.T


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_ranks(REPO / "tests" / "distributed" / "fault_worker.py", lambda r: (str(r), str(WORLD), str(port), str(out)),
              lambda r: _env(LOCAL_RANK=str(r)), WORLD, 180)
    return out


def results(out: Path, name: str, which: range | tuple[int, ...] = range(WORLD)) -> list[dict[str, Any]]:
    res = [json.loads((out / f"{name}.{r}.json").read_text()) for r in which]
    for r in res:
        assert "unexpected" not in r, r["unexpected"]
    return res


def refused_alike(res: list[dict[str, Any]]) -> None:
    """Every rank raised the same message after exchanging records, and the engine's next all_reduce summed right."""
    assert not any(r["ok"] for r in res)
    assert len({r["error"] for r in res}) == 1, [r["error"] for r in res]
    assert all(r["all_reduce"] == 10.0 for r in res), [r["all_reduce"] for r in res]
    assert all(r["ranks"] == WORLD for r in res)  # the bring-up command prints these ranks' table


def test_infinite_timeout_waits_without_a_limit(ranks: Path) -> None:
    res = results(ranks, "agree_inf")
    assert all(r["ok"] and r["size"] == WORLD and r["all_reduce"] == 10.0 for r in res)


def test_timeout_longer_than_the_groups_own_is_honoured(ranks: Path) -> None:
    """The group's timeout is 3 s; rank 3 arrives after 4 s; timeout=8 holds."""
    res = results(ranks, "long_timeout")
    assert all(r["ok"] and r["all_reduce"] == 10.0 for r in res), res
    assert res[0]["seconds"] > 3.0


def test_a_late_rank_raises_like_the_ranks_that_gave_up(ranks: Path) -> None:
    res = results(ranks, "late")
    assert not any(r["ok"] for r in res), [r.get("describe") for r in res]  # never "4 ranks agree" on the late rank
    for r in (res[0], res[2], res[3]):
        assert r["missing"] == [1] and "rank 1 had not called check_agreement" in r["error"], r["error"]
        assert f"timeout={T:g} s" in r["error"] and T <= r["seconds"] < T + 2.0
    assert res[1]["missing"] == [1] and "arrived after the check" in res[1]["error"] and "gave up after waiting" in res[1]["error"]
    assert res[1]["seconds"] < 1.5


def test_ranks_passing_different_mixed(ranks: Path) -> None:
    res = results(ranks, "args_mixed")
    refused_alike(res)
    assert "mixed='error' on ranks 0, 2, 3; mixed='allow' on rank 1" in res[0]["error"]


def test_ranks_passing_different_gather(ranks: Path) -> None:
    res = results(ranks, "args_gather")
    refused_alike(res)
    assert "gather=False on ranks 0, 1, 3; gather=True on rank 2" in res[0]["error"]


def test_ranks_passing_different_timeouts(ranks: Path) -> None:
    res = results(ranks, "args_timeout")
    refused_alike(res)
    assert f"timeout={T:g} on ranks 0-2; timeout={2 * T:g} on rank 3" in res[0]["error"]


def test_an_invalid_timeout_on_one_rank_is_refused_on_every_rank(ranks: Path) -> None:
    res = results(ranks, "bad_timeout")
    refused_alike(res)
    assert "rank 0 (host " in res[0]["error"] and "check_agreement(timeout=-1): give a positive number of seconds" in res[0]["error"]


def test_a_rank_whose_profile_fails_still_joins_and_is_quoted(ranks: Path) -> None:
    res = results(ranks, "profile_fails")
    refused_alike(res)
    assert "rank 2 (host " in res[0]["error"] and "had not called" not in res[0]["error"]
    assert "9" in res[0]["error"].split("rank 2 (host ", 1)[1].splitlines()[0]  # its own error, about device 9


def test_only_the_crashed_rank_is_named(ranks: Path) -> None:
    """4 ranks, rank 3 crashed, rank 2 arrives 1.5 s after the others: only rank 3 is missing, on every rank."""
    res = results(ranks, "crashed", (0, 1, 2))
    for r in res:
        assert not r["ok"] and r["missing"] == [3], r["error"]
        assert "rank 3 had not called check_agreement (ranks 0-2 had)" in r["error"]
    assert res[0]["seconds"] < 2.5 + 1.5


def test_rank_0_gone_with_its_store_is_named(tmp_path: Path) -> None:
    """Rank 0 hosts the rendezvous store (init_process_group without torchrun) and exits right after raising: the other
    ranks say that rank 0 and its store went away, naming rank 0 as missing, not only that a store did not answer."""
    world = 3
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_ranks(REPO / "tests" / "distributed" / "store_gone_worker.py", lambda r: (str(r), str(world), str(port), str(tmp_path)),
              lambda r: _env(LOCAL_RANK=str(r)), world, 120)
    res = [json.loads((tmp_path / f"store_gone.{r}.json").read_text()) for r in range(1, world)]
    for r in res:
        assert "unexpected" not in r, r
        assert not r["ok"] and r["missing"] == [0], r
        assert "rank 0 is gone" in r["error"] and "lives in rank 0's process" in r["error"] and "without torchrun" in r["error"], r
        assert r["seconds"] < 15, r  # not the whole timeout
