"""Settings are checked when read: an op's model or measured table from the environment, an unknown key's "did you mean"."""

from __future__ import annotations

import pytest

import hwprofile
from hwprofile.cli import main
from hwprofile.errors import SettingError
from hwprofile.optable import TABLE


@pytest.mark.parametrize("field", ["model", "measured"])
@pytest.mark.parametrize("op", list(TABLE))
def test_a_garbage_model_or_measured_variable_stops_profile_and_show_naming_it(
    op: str, field: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    var = f"HWPROFILE_{op.upper()}_{field.upper()}"
    monkeypatch.setenv(var, "garbage;;x=1")
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    with pytest.raises(SettingError, match=f"^{var}: {op}.{field} .*fix {var}, or unset it"):
        hwprofile.profile()
    assert main(["show"]) == 2
    err = capsys.readouterr().err
    assert var in err and "internal error" not in err and "not fitted" not in err


def test_a_valid_model_variable_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    shipped = hwprofile.profile()["router_gemm.model"]
    assert shipped  # the sm90 plugin ships a fitted model
    monkeypatch.setenv("HWPROFILE_ROUTER_GEMM_MODEL", shipped)
    hwprofile.reset()
    assert hwprofile.profile().explain("router_gemm.model").winner.kind == "env"


def test_an_unknown_key_gets_did_you_mean(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    with pytest.raises(SettingError, match=r"unknown setting 'router_gemm.max_tokenz'; did you mean 'router_gemm.max_tokens'\?"):
        hwprofile.profile()["router_gemm.max_tokenz"]
    assert main(["explain", "router_gemm.max_tokenz"]) == 2
    assert "did you mean 'router_gemm.max_tokens'?" in capsys.readouterr().err


def test_a_plugin_setting_an_undeclared_key_gets_did_you_mean() -> None:
    from hwprofile.settings import Setting, SettingsResolver

    b = SettingsResolver()
    b.declare([Setting("engine.max_batch", "int", 8, "largest batch")], by="engine")
    with pytest.raises(SettingError, match=r"undeclared setting 'engine.max_bach'; did you mean 'engine.max_batch'\?"):
        b.add("plugin", "engine 1.0", {"engine.max_bach": 4}, who="plugin engine")
