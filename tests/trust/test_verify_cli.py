"""What the CLI says of verification: ``explain OP --shape`` names the instance a shape takes and its state (the gate's
with its served router's selection), ``show`` counts verdicts per kernel, ``explain verify`` names who turned it off."""

from __future__ import annotations

import json

import pytest

import hwprofile
from hwprofile.cli import main


@pytest.fixture
def b200(monkeypatch: pytest.MonkeyPatch, no_downstream: None, tmp_path: object) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "b200")
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path))
    monkeypatch.delenv("HWPROFILE_VERIFY", raising=False)
    hwprofile.reset()


@pytest.mark.parametrize("op, shape, words", [
    ("router_gemm", "8x256x7168", "hwp100_skinny_mma<"),
    ("moe_gate", "4x256x7168", "the selection of deepseek-v3: top_k=8, n_group=8, topk_group=4"),
])
def test_explain_shape_says_which_instance_and_that_it_is_not_yet_verified(
    b200: None, capsys: pytest.CaptureFixture[str], op: str, shape: str, words: str
) -> None:
    assert main(["explain", op, "--shape", shape]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("verification:")]
    assert words in line and "not yet verified on this device" in line and "float64" in line
    assert main(["explain", op, "--shape", shape, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["verification"]) == 1 and words in doc["verification"][0]


def test_verification_off_is_named_with_its_source(b200: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_VERIFY", "off")
    hwprofile.reset()
    assert main(["explain", "router_gemm", "--shape", "8x256x7168"]) == 0  # a kernel route on the B200
    assert "verification off (environment HWPROFILE_VERIFY)" in capsys.readouterr().out
    assert main(["show"]) == 0
    assert "off (environment HWPROFILE_VERIFY)" in capsys.readouterr().out
    assert main(["show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verification"]["gemv"]["verify"] is False


def test_show_counts_verdicts_per_kernel(b200: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show"]) == 0
    out = capsys.readouterr().out
    assert "verified on this device (float64)" in out and "not yet verified" in out
