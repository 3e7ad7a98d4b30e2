"""On the H200: a faked fallback change is re-measured with the real timer, at the first profile() too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import hwprofile
from hwprofile import retune, sweep, tuning
from hwprofile.optable import OPS

from .helpers import stale_tuned_file


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> hwprofile.Profile:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    stale_tuned_file(prof)  # router_gemm measured against another fallback function
    hwprofile.reset()
    return hwprofile.profile(0)


@pytest.mark.hwprofile_gpu("sm_90")
def test_tune_re_measures_a_faked_fallback_change_on_the_gpu(gpu: hwprofile.Profile) -> None:
    assert "router_gemm" in [f.op for f in retune.findings(gpu) if f.status == "changed"]
    result = hwprofile.tune(0, ops=["router_gemm"], reps=5)
    assert result.measured == len(sweep.default_grid("router_gemm")) and len(result.written) == 1
    stamp, thresholds = tuning.read_tuned(result.written[0])
    assert stamp.fallback["function"] == OPS["router_gemm"].fallback and stamp.plan and stamp.kernel
    prof = hwprofile.profile(0)
    for key in retune.decided_keys("router_gemm"):  # the fitted model and the per-shape table apply
        assert prof.explain(key).winner.source == f"tuned file {result.written[0]}"
        assert prof[key] == thresholds[key]
    assert {f.op: f.status for f in retune.findings(prof)}["router_gemm"] == "fresh"


@pytest.mark.hwprofile_gpu("sm_90")
def test_hwprofile_tune_stale_tunes_at_the_first_profile_on_the_gpu(gpu: hwprofile.Profile) -> None:
    code = "import hwprofile; p = hwprofile.profile(0); print(p.explain('router_gemm.model').winner.source)"
    env = {**os.environ, "HWPROFILE_TUNE": "stale"}
    env.pop("HWPROFILE_DEVICE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("tuned file "), out.stdout + out.stderr
