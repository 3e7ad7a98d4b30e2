"""A plugin declaring thousands of settings costs the first profile() linearly, not quadratically (issue 25).

Declaring N settings checked each new one against every earlier declaration for a clash of
environment names, computing ``env_var`` N^2 / 2 times: 2000 settings made every first profile()
cost 1.2-1.5 s (300: 0.18 s). The plugin here is a real module found through the entry-point scanner,
as in test_hostile_plugins.py.

Work is counted, not timed: every Python call and line executed (``sys.settrace``) and every C call
(``sys.setprofile``) during ``hwprofile.profile()``. Linear resolution does about 4x the work for
4x the settings; a quadratic step does about 16x. A run going over the linear budget stops
counting at once, so a regression fails fast instead of tracing millions of calls.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import hwprofile
from hwprofile import _entrypoints, registry
from hwprofile.settings import Setting, SettingsResolver

SMALL, LARGE = 500, 2000
#: LARGE / SMALL is 4: a linear cost grows about 4x, a quadratic one 16x
MAX_RATIO = 6.0

PLUGIN = '''
from hwprofile.plugin import EnvDefault, Setting, Value, hookimpl

N = {n}


@hookimpl
def hwprofile_declare_settings():
    return [Setting(f"many.s{{i}}", "int", i, "one of many", minimum=0, maximum=1 << 30) for i in range(N)]


@hookimpl
def hwprofile_settings(device, resolved):
    return {{f"many.s{{i}}": Value(i + 1, "plugin layer") for i in range(0, N, 2)}}


@hookimpl
def hwprofile_env_defaults(device, settings):
    return {{"MANY_COUNT": EnvDefault(str(N), "how many")}}
'''


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    name = f"many{n}_mod"
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN.format(n=n)))
    monkeypatch.delitem(sys.modules, name, raising=False)
    ep = _entrypoints.EntryPoint("many", name, "hwprofile-many", "0.1.0")
    real = _entrypoints.find_entry_points
    monkeypatch.setattr(registry, "find_entry_points", lambda group: [*real(group), ep])
    hwprofile.reset()


class _Budget(Exception):
    pass


def _count(fn: Callable[[], Any], budget: float = float("inf")) -> tuple[int, Any]:
    """(events, result) of ``fn()``: Python calls and lines, and C calls; counting stops past ``budget``."""
    events = 0
    over = False

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal events, over
        events += 1
        if events > budget:
            over = True
            sys.settrace(None)
            sys.setprofile(None)
            return None
        return tracer

    def profiler(frame: FrameType, event: str, arg: object) -> None:
        nonlocal events
        if event == "c_call":
            events += 1

    old_trace, old_profile = sys.gettrace(), sys.getprofile()
    sys.settrace(tracer)
    sys.setprofile(profiler)
    try:
        result = fn()
    finally:
        sys.settrace(old_trace)
        sys.setprofile(old_profile)
    if over:
        raise _Budget(f"more than {budget:.0f} events")
    return events, result


def _first_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, budget: float = float("inf")) -> int:
    _install(tmp_path, monkeypatch, n)
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_MANY_S1", "7")  # the user's layer too
    hwprofile.profile(0)  # import the module once: its import is not resolution
    hwprofile.reset()
    events, prof = _count(lambda: hwprofile.profile(0), budget)
    assert len([k for k in prof.settings if k.startswith("many.")]) == n
    assert prof["many.s0"] == 1 and prof["many.s1"] == 7 and prof["many.s3"] == 3 and prof.env_defaults["MANY_COUNT"].value == str(n)
    return events


def test_first_profile_work_grows_linearly_with_declared_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = _first_profile(tmp_path, monkeypatch, SMALL)
    try:
        large = _first_profile(tmp_path, monkeypatch, LARGE, budget=MAX_RATIO * small)
    except _Budget as exc:
        pytest.fail(f"{LARGE} settings cost {exc} against {small} for {SMALL}: not linear (a ratio of {MAX_RATIO} or more)")
    assert large / small < MAX_RATIO, (small, large)


def test_declaring_settings_computes_each_env_name_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot function of the quadratic step, counted directly: ``Setting.env_var`` per declaration."""
    calls = [0]
    real = Setting.env_var

    def counted(self: Setting) -> str:
        calls[0] += 1
        return real.fget(self)  # type: ignore[attr-defined,no-any-return]

    settings = [Setting(f"many.s{i}", "int", i, "x") for i in range(LARGE)]
    monkeypatch.setattr(Setting, "env_var", property(counted))
    r = SettingsResolver()
    r.declare(settings, by="plugin many", namespace="many")
    assert calls[0] <= 2 * LARGE, calls[0]


def test_a_clash_among_many_is_still_found_naming_both() -> None:
    from hwprofile.errors import SettingError

    r = SettingsResolver()
    r.declare([Setting(f"many.s{i}", "int", i, "x") for i in range(LARGE)], by="plugin many", namespace="many")
    with pytest.raises(SettingError, match=r"settings 'many.s_1' .*and 'many.s.1' .*HWPROFILE_MANY_S_1"):
        r.declare([Setting("many.s_1", "int", 0, "x"), Setting("many.s.1", "int", 0, "x")], by="plugin more", namespace="many")
