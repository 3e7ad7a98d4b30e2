"""Warm-up and CUDA-graph capture on the real GPU (issue 23 items 1 and 5), each scenario in a fresh process
(``scenarios.py``) so that no earlier test has already initialised cuBLAS or loaded a kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.hwprofile_gpu("sm_90")
ROOT = Path(__file__).resolve().parents[2]


def scenario(name: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    full.update({"HWPROFILE_CACHE_DIR": str(tmp_path / "cache"), **env})
    p = subprocess.run([sys.executable, "-m", "tests.serving.scenarios", name], capture_output=True, text=True, env=full, cwd=ROOT,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "cudaErrorStreamCaptureInvalidated" not in p.stderr and "CUBLAS_STATUS" not in p.stderr, p.stderr
    return json.loads(p.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_warmed_step_captures_with_never_seen_shapes_of_both_paths(tmp_path: Path) -> None:
    out = scenario("warmed_capture", tmp_path)
    assert out["loaded"] >= 2 and set(out["fallbacks"]) == {"gemv", "router_gemm"}
    assert all(e < 1e-2 for e in out["rel_errors"].values()), out["rel_errors"]
    assert out["stats"]["kernels"]["compiles"] == out["loaded"]  # all at warm-up; forbid_compile held afterwards


def test_first_call_in_capture_without_warmup_is_the_clear_error_and_the_device_keeps_working(tmp_path: Path) -> None:
    out = scenario("unwarmed_capture", tmp_path)
    assert "gemv (M=1, N=4096, K=4096)" in out["error"] and "hwprofile.ops.warmup" in out["error"]
    assert out["rel_error_after"] < 1e-2 and out["stats"]["gemv"]["kernel"] == 1


def test_warm_cache_first_call_compiles_nothing(tmp_path: Path) -> None:
    cold = scenario("first_call", tmp_path)
    warm = scenario("first_call", tmp_path, HWPROFILE_NO_COMPILE="1")
    assert cold["stats"]["kernels"]["compiles"] == 1 and warm["stats"]["kernels"]["compiles"] == 0
    assert sum(warm["stats"]["kernels"]["hits"].values()) == 1
