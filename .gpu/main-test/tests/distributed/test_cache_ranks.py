"""The kernel cache shared by the ranks of one host: concurrent first compiles build each kernel once.

Each process is what a rank does on its first calls (or what ``hwprofile compile`` does to pre-warm
an image): compile every kernel instance of a target through the shared on-disk cache. NVRTC runs
on the CPU, so this needs no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

RANKS = 3
TARGET = "sm_90a"


def compile_cmd(cache: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(HWPROFILE_CACHE_DIR=str(cache), HWPROFILE_CONFIG_DIR=os.environ["HWPROFILE_CONFIG_DIR"])
    return [sys.executable, "-m", "hwprofile.cli", "compile", "--arch", TARGET, "--jobs", "1", "--json"], env


def run_concurrently(cache: Path, n: int) -> list[list[dict[str, Any]]]:
    cmd, env = compile_cmd(cache)
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    return [json.loads(out) for out, _ in outs]


def test_ranks_of_one_host_compile_each_kernel_once(tmp_path: Path) -> None:
    cache = tmp_path / "kernels"
    reports = run_concurrently(cache, RANKS)
    by_kernel: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rank_report in reports:
        for r in rank_report:
            assert not r["errors"], r["errors"]
            by_kernel.setdefault((r["plugin"], r["op"]), []).append(r)
    assert by_kernel, "no kernel to compile for " + TARGET
    instances = sum(rs[0]["instances"] for rs in by_kernel.values())
    compiled = sum(r["compiled"] for rs in by_kernel.values() for r in rs)
    cached = sum(r["cached"] for rs in by_kernel.values() for r in rs)
    shared = sum(r["shared"] for rs in by_kernel.values() for r in rs)  # another kernel's entry, compiled once for both
    entries = len(list(cache.glob("*.cubin")))  # kernels that share a source and an instance share an entry
    assert all(len(rs) == RANKS for rs in by_kernel.values())
    assert compiled + cached + shared == RANKS * instances
    assert compiled == entries, f"{compiled} NVRTC compiles for {entries} distinct cubins across {RANKS} processes"
    assert 0 < entries <= instances
    # a pre-warmed cache (an image built with `hwprofile compile`): a later rank compiles nothing
    (again,) = run_concurrently(cache, 1)
    assert all(r["compiled"] == 0 and r["cached"] + r["shared"] == r["instances"] for r in again)
