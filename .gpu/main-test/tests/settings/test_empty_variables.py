"""An empty ``HWPROFILE_*`` variable that is refused says what to do (issue 26's papercut, issue 25).

A variable that is present counts as set, even when empty (``export HWPROFILE_CACHE=``, an env
file's ``HWPROFILE_CACHE=`` line), so it does not give the default. The error names the variable,
says it is set but empty, and says to unset it or give it one of the values it takes.
"""

from __future__ import annotations

import re

import pytest

import hwprofile
from hwprofile import _env
from hwprofile.errors import HwprofileError, SettingError
from hwprofile.settings import CORE_SETTINGS, check_environment


def _refuses(var: _env.Var[object], text: str) -> bool:
    try:
        var.parse(text)
    except HwprofileError:
        return True
    return False


#: control variables whose parser refuses an empty value (the others read "" as unset or none)
REFUSING = [v for v in _env.VARS if _refuses(v, "")]
BLANK_REFUSING = [v for v in _env.VARS if _refuses(v, " ")]


def _assert_hint(msg: str, name: str, accepts: str, text: str) -> None:
    what = "empty" if not text else f"blank ({text!r})"
    assert msg.startswith(f"{name}={text!r} is not valid: expected "), msg
    assert accepts in msg, msg
    assert f"{name} is set but {what}, which is not the same as unset" in msg, msg
    assert f"'unset {name}'" in msg and "give it one of the values above" in msg, msg


def test_the_switches_refuse_empty() -> None:
    names = {v.name for v in REFUSING}
    assert {_env.CACHE.name, _env.STRICT.name, _env.DETERMINISTIC.name, _env.PLUGIN_FORCE.name} <= names


@pytest.mark.parametrize("var", REFUSING, ids=lambda v: v.name)
@pytest.mark.parametrize("text", ["", " ", "\t"])
def test_control_variable_set_but_empty_says_what_to_do(var: _env.Var[object], text: str) -> None:
    if text and var not in BLANK_REFUSING:
        pytest.skip(f"{var.name} reads blanks as unset")
    with pytest.raises(var.error) as e:
        var.read({var.name: text})
    msg = str(e.value)
    _assert_hint(msg, var.name, var.accepts, text)
    assert f"for the default ({var.unset})" in msg


@pytest.mark.parametrize("var", BLANK_REFUSING, ids=lambda v: v.name)
def test_every_profile_reads_the_hint(var: _env.Var[object]) -> None:
    with pytest.raises(var.error, match=re.escape(f"{var.name} is set but blank")):
        check_environment({var.name: " "}, ())


def test_a_value_that_is_not_empty_keeps_its_message() -> None:
    with pytest.raises(SettingError) as e:
        _env.CACHE.read({_env.CACHE.name: "maybe"})
    assert str(e.value) == f"{_env.CACHE.name}='maybe' is not valid: expected {_env.CACHE.accepts} (unset it for the default: on)"


SETTING_CASES = [
    ("router_gemm.max_tokens", "an integer in [0, 16]"),
    ("gemv.split_k", "a boolean (1/0, true/false, yes/no, on/off)"),
    ("strict", "1/0, true/false, yes/no, on/off"),
]


@pytest.mark.parametrize(("key", "allowed"), SETTING_CASES)
@pytest.mark.parametrize("text", ["", "  "])
def test_setting_variable_set_but_empty_says_what_to_do(monkeypatch: pytest.MonkeyPatch, key: str, allowed: str, text: str) -> None:
    """The settings' environment layer: ``HWPROFILE_ROUTER_GEMM_MAX_TOKENS=`` said only "expected an integer in [0, 16]"."""
    setting = next(s for s in CORE_SETTINGS if s.key == key)
    var = setting.env_var
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv(var, text)
    hwprofile.reset()
    with pytest.raises(SettingError) as e:
        hwprofile.profile(0)
    msg = str(e.value)
    assert allowed in msg and f"{var} is set but " in msg and f"'unset {var}'" in msg, msg
    if key != "strict":  # strict is a control variable too: its record's message (the default) comes first
        assert msg.startswith(f"{var}={text!r} is not valid for {key}: expected {allowed}") and f"the other layers give {key}" in msg


def test_a_float_and_an_enum_setting_say_it_too() -> None:
    from hwprofile import Setting

    for s in (Setting("eng.ratio", "float", 0.5, "x", minimum=0, maximum=1), Setting("eng.mode", "enum", "a", "x", choices=("a", "b"))):
        with pytest.raises(SettingError, match=re.escape(f"{s.env_var} is set but empty")):
            s.parse("", origin=s.env_var)


def test_a_str_setting_takes_empty_and_non_variable_origins_get_no_hint() -> None:
    from hwprofile import Setting

    assert Setting("eng.name", "str", "x", "x").parse("", origin="HWPROFILE_ENG_NAME") == ""
    with pytest.raises(SettingError) as e:
        Setting("eng.n", "int", 1, "x").parse("", origin="tuned file t.toml")
    assert "set but empty" not in str(e.value)
