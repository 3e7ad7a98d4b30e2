"""Start one process per gloo rank and wait for all of them: what every multi-process test of the suite shares."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest


def run_ranks(worker: Path, args: Callable[[int], Sequence[str]], env: Callable[[int], Mapping[str, str]], world: int,
              timeout: float) -> None:
    """Run ``worker`` once per rank (``python worker *args(rank)`` with ``env(rank)``); fail the test naming every
    rank's output when one hangs past ``timeout`` seconds or exits non-zero."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), *args(r)], env=dict(env(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for r in range(world)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the gloo ranks hung: " + "\n".join(logs))
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
