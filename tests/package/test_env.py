"""Every ``HWPROFILE_*`` control variable is declared once, in ``hwprofile._env``, and read through it.

The records (name, parser, default, doc) are the one reading of each variable: no other core module
spells a control variable in code, docs/architecture.md's table lists each, every parser accepts
and refuses exactly what is written below, and the two variables that are settings are declared by
their records.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import _env
from hwprofile.errors import DeviceError, HwprofileError, PluginError, SettingError
from hwprofile.settings import CORE_SETTINGS, check_environment

PKG = Path(hwprofile.__file__).parent
ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for p in PKG.rglob("*.py") if p.name != "_env.py")
NAMES = {v.name for v in _env.VARS}


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """String constants that are code, not documentation (a string expression statement is a docstring)."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_the_scan_tells_code_from_docstrings() -> None:
    src = '"""HWPROFILE_DOC in a docstring"""\ndef f():\n    """HWPROFILE_X too"""\n    return env.get("HWPROFILE_CACHE"), f"HWPROFILE_{k}"'
    assert sorted(c.value for c in _code_strings(ast.parse(src))) == ["HWPROFILE_", "HWPROFILE_CACHE"]


def test_no_core_module_spells_a_control_variable_in_code() -> None:
    """A string starting with ``HWPROFILE_`` outside ``_env.py`` is a second declaration of a variable (or of the prefix)."""
    found = [
        f"{_rel(p)}:{c.lineno}: {c.value[:60]!r}"
        for p in SOURCES
        for c in _code_strings(ast.parse(p.read_text()))
        if c.value.startswith(_env.PREFIX)
    ]
    assert not found, "read it through hwprofile._env (VAR.read(environ), VAR.name, _env.PREFIX):\n" + "\n".join(found)


_NAME_RE = re.compile(r"\bHWPROFILE_[A-Z0-9_]+")
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PKG)))
def test_messages_format_variable_names_from_their_records(path: Path) -> None:
    """A message names a control variable as ``{_env.CACHE.name}``, so renaming one changes every message."""
    found = [
        f"{_rel(path)}:{c.lineno}: {name}"
        for c in _code_strings(ast.parse(path.read_text()))
        for name in _NAME_RE.findall(c.value)
        if name in NAMES
    ]
    assert not found, "format these from hwprofile._env:\n" + "\n".join(found)


def test_every_variable_has_a_row_in_the_architecture_table() -> None:
    """docs/architecture.md, "Control variables": one table row per variable (the README has no table of them)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    rows = set(re.findall(r"^\| `(HWPROFILE_[A-Z0-9_]+)` \|", doc, re.M))
    assert NAMES <= rows, f"undocumented: {sorted(NAMES - rows)}"
    assert rows <= NAMES, f"documented but not declared in hwprofile._env: {sorted(rows - NAMES)}"


def _own_imports(module: str) -> set[str]:
    tree = ast.parse((PKG / f"{module}.py").read_text())
    own = {n.module or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level for a in n.names}
    absolute = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in absolute if m.split(".")[0] == "hwprofile"}, module
    return own


def test_env_is_the_bottom_of_the_graph() -> None:
    """_env imports only errors, _redact, _storeurl and _record (at run time, in functions included); _storeurl only
    _redact, errors only _redact, and _redact and _record nothing of hwprofile."""
    assert _own_imports("_env") == {"errors", "_redact", "_storeurl", "_record"}
    assert _own_imports("_record") == set()
    assert _own_imports("_storeurl") == {"_redact"}
    assert _own_imports("errors") == {"_redact"}
    assert _own_imports("_redact") == set()


def test_every_record_is_complete() -> None:
    for v in _env.VARS:
        assert v.name.startswith(_env.PREFIX) and v.name.isupper(), v
        assert v.doc and v.accepts and v.unset, v
        assert issubclass(v.error, HwprofileError), v
    assert len(NAMES) == len(_env.VARS)
    with pytest.raises(AttributeError, match=r"Var is frozen: make a changed copy with .replace\(default=...\)"):
        _env.CACHE.default = False  # type: ignore[misc]


# --- parsers: what each accepts and refuses ----------------------------------------------------------

ON = ["1", "true", "yes", "on", "TRUE", " On ", "Yes"]
OFF = ["0", "false", "no", "off", "OFF", " False "]
BAD_SWITCH = ["", "2", "maybe", "enabled", "disabled", "y", "n", "o n"]
SWITCHES = {_env.PLUGIN_FORCE, _env.CACHE, _env.STRICT, _env.DETERMINISTIC, _env.SELFTEST, _env.VERIFY}

#: Per variable: accepted text -> value, and refused texts (empty when it accepts anything).
CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    _env.DEVICE.name: (
        {"h200": ("h200",), " gb300 , rtx-pro-6000 ": ("gb300", "rtx-pro-6000"), "sm_110,": ("sm_110",), "": ()},
        [" ", ",", " , "],
    ),
    _env.PLUGIN.name: ({"sm90": "sm90", " sm90 ": "sm90", "": None, "  ": None}, ["sm90,sm100", ","]),
    _env.DISABLE_PLUGINS.name: ({"sm90": ("sm90",), "sm90, myengine ,": ("sm90", "myengine"), "": (), " , ": ()}, []),
    _env.CACHE_DIR.name: ({"/tmp/k": "/tmp/k", "": None, " rel/dir ": " rel/dir "}, []),
    _env.NO_COMPILE.name: ({"1": True, "off": False}, ["maybe"]),
    _env.CONFIG_DIR.name: ({"/etc/hwp": "/etc/hwp", "": None}, []),
    _env.TUNED_FILE.name: (
        {"/a.toml": ("/a.toml",), f"/a.toml{os.pathsep}{os.pathsep} {os.pathsep}/b.toml": ("/a.toml", "/b.toml"), "": ()},
        [],
    ),
    _env.TUNE.name: (
        {"stale": "stale", " Stale ": "stale", "1": "stale", "on": "stale", "off": "off", "0": "off"}, ["", "all", "yes please"]
    ),
    _env.REMOTE.name: (
        {"redis://cache:6379": "redis://cache:6379", " rediss://u:pw@cache/1 ": "rediss://u:pw@cache/1", "": None, " ": None},
        ["cache:6379", "redis://", "http://cache", "redis://cache:http", "redis://cache/one"],
    ),
    _env.REMOTE_TIMEOUT.name: ({"1": 1.0, "0.25": 0.25, " 60 ": 60.0}, ["", "0", "-1", "61", "fast"]),
    _env.TRACEBACK.name: ({"1": True, "0": True, "yes please": True, "": False}, []),
    **{v.name: ({**dict.fromkeys(ON, True), **dict.fromkeys(OFF, False)}, BAD_SWITCH) for v in SWITCHES},
}
_BY_NAME = {v.name: v for v in _env.VARS}


def test_every_variable_has_parser_cases() -> None:
    assert set(CASES) == NAMES


@pytest.mark.parametrize(("name", "text", "value"), [(n, t, v) for n, (ok, _) in CASES.items() for t, v in ok.items()])
def test_parser_accepts(name: str, text: str, value: object) -> None:
    var = _BY_NAME[name]
    assert var.parse(text) == value
    assert var.read({name: text}) == value


@pytest.mark.parametrize(("name", "text"), [(n, t) for n, (_, bad) in CASES.items() for t in bad])
def test_parser_refuses_naming_the_variable_and_the_accepted_values(name: str, text: str) -> None:
    var = _BY_NAME[name]
    with pytest.raises(var.error) as e:
        var.read({name: text})
    msg = str(e.value)
    assert msg.startswith(f"{name}={text!r} is not valid: ") and var.unset in msg
    assert f": expected {var.accepts}" in msg or f". Expected {var.accepts}" in msg  # a reason may come first


def test_unset_is_the_default() -> None:
    for v in _env.VARS:
        assert v.read({}) == v.default, v
    assert _env.CACHE.read({}) is True and _env.STRICT.read({}) is False and _env.DEVICE.read({}) == ()


def test_refused_values_raise_the_error_of_their_concern() -> None:
    assert _env.DEVICE.error is DeviceError and _env.PLUGIN.error is PluginError and _env.CACHE.error is SettingError


@pytest.mark.parametrize(("name", "text"), [(n, bad[0]) for n, (_, bad) in CASES.items() if bad])
def test_resolving_a_profile_reads_every_control_variable(name: str, text: str) -> None:
    """settings.check_environment (every profile, and hwprofile compile) refuses a bad value of any of them."""
    with pytest.raises(_BY_NAME[name].error, match=re.escape(f"{name}={text!r} is not valid")):
        check_environment({name: text}, ())


def test_control_variables_are_known_names() -> None:
    assert check_environment({**dict.fromkeys(NAMES, "1"), _env.REMOTE.name: "redis://cache:6379"}, ()) == []


# --- the variables that are settings -------------------------------------------------------------


SETTING_VARS = [v for v in _env.VARS if v.setting is not None]


def test_strict_deterministic_and_verify_are_settings_declared_by_their_records() -> None:
    assert {v.name for v in SETTING_VARS} == {_env.STRICT.name, _env.DETERMINISTIC.name, _env.VERIFY.name}
    core = {s.key: s for s in CORE_SETTINGS}
    for v in SETTING_VARS:
        s = core[v.setting]
        assert (s.env_var, s.type, s.default, s.doc) == (v.name, "bool", v.default, v.doc)


@pytest.mark.parametrize("var", SETTING_VARS, ids=lambda v: v.name)
def test_a_setting_variable_has_one_reading(var: _env.Var[bool]) -> None:
    """The setting's environment layer and the record accept and refuse the same texts, with the same values."""
    setting = next(s for s in CORE_SETTINGS if s.key == var.setting)
    ok, bad = CASES[var.name]
    for text, value in ok.items():
        assert setting.parse(text, origin=var.name) is value is var.parse(text)
    for text in bad:
        with pytest.raises(SettingError):
            setting.parse(text, origin=var.name)
        with pytest.raises(SettingError):
            var.parse(text)
