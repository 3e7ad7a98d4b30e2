"""Every ``HWPROFILE_*`` control variable the core reads, declared once: name, parser, one line of doc.

Never imports a hwprofile module but :mod:`hwprofile.errors`, :mod:`hwprofile._redact`,
:mod:`hwprofile._storeurl` and :mod:`hwprofile._record` (which import nothing else of hwprofile): it sits at the bottom of the import
graph, so that detection, the registry, settings and the kernel pipeline can all read their
variables here without importing one another.

Each :class:`Var` is the one reading of its variable: core modules call ``VAR.read(environ)`` (and
format ``VAR.name`` into their messages) instead of spelling the name or parsing the text
themselves. :data:`VARS` lists them all, and every consumer iterates it: ``settings.check_environment``
validates each (one error naming the variable and the accepted values) and warns about any other
``HWPROFILE_*`` name that is not a setting's; ``settings.CORE_SETTINGS`` builds the two settings
of the next paragraph from it; and ``tests/package/test_env.py`` fails when another core module spells a control variable
in code, or when docs/architecture.md's table of control variables misses one. (``hwprofile
doctor`` reports every ``HWPROFILE_*`` variable that is set, by :data:`PREFIX`.)

A variable whose record names a ``setting`` (``HWPROFILE_STRICT``, ``HWPROFILE_DETERMINISTIC``) is
declared here and nowhere else: :data:`hwprofile.settings.CORE_SETTINGS` builds the core ``bool``
setting from the record (key, default, doc), the setting's environment layer parses the variable
with the same :func:`switch`, and readers use the resolved setting (``profile["strict"]``), never
the raw variable. Every other setting ``a.b`` (an op's, a plugin's) is overridden by
``PREFIX + "A_B"`` (``Setting.env_var``): those variables are declared by their settings, not here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Final, Generic, TypeVar

from . import _storeurl
from ._record import Record, _set, final
from ._redact import redact
from .errors import DeviceError, HwprofileError, PluginError, SettingError

_T = TypeVar("_T")

#: Every variable hwprofile owns starts with it; a setting ``a.b`` is overridden by ``HWPROFILE_A_B``.
PREFIX = "HWPROFILE_"
#: The spellings of on and off every switch (and every ``bool`` setting) accepts, case-insensitive.
SWITCH_VALUES = "1/0, true/false, yes/no, on/off"
_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


@final
class Var(Record, Generic[_T]):
    """One control variable: its name, its parser, its default (when unset) and what it is for."""

    #: ``"HWPROFILE_CACHE"``.
    name: str
    #: One line: what the variable decides (docs/architecture.md's table repeats it).
    doc: str
    #: The accepted values in words, for the error a refused value raises.
    accepts: str
    #: Text -> value; raises ``ValueError`` for a value outside :attr:`accepts`.
    parser: Callable[[str], _T]
    #: The value while the variable is unset.
    default: _T
    #: What an unset variable means, in words (``"on"``, ``"the real GPUs"``), for the error a refused value raises;
    #: ``""`` (the default): ``"on"``/``"off"`` for a switch, else ``"none"``.
    unset: str = ""
    #: The error a refused value raises (a :class:`~hwprofile.errors.HwprofileError` subclass).
    error: type[HwprofileError] = SettingError
    #: The key of the core setting this variable overrides, or ``None`` for a variable that is not a setting.
    setting: str | None = None
    #: How a value is quoted in messages: the text itself, or with its secret part hidden (:func:`hwprofile._redact.redact`).
    shown: Callable[[str], str] = str

    def __post_init__(self) -> None:
        if not self.unset:
            _set(self, "unset", ("on" if self.default else "off") if isinstance(self.default, bool) else "none")

    def parse(self, text: str) -> _T:
        """The value of ``text``; a refused value is :attr:`error`, naming the variable and the accepted values."""
        try:
            return self.parser(text)
        except ValueError as exc:
            raise self.refused(text, exc.reason if isinstance(exc, _storeurl.Refused) else "") from None

    def read(self, environ: Mapping[str, str] | None = None) -> _T:
        """The variable's value in ``environ`` (default ``os.environ``): :attr:`default` when unset."""
        raw = (os.environ if environ is None else environ).get(self.name)
        return self.default if raw is None else self.parse(raw)

    def refused(self, text: str, reason: str = "") -> HwprofileError:
        """The error for a refused value ``text`` (raised by :meth:`parse`); ``reason``, when given, says what is wrong in it.

        An empty (or blank) value says so and what to do, since ``export VAR=`` or an env file's
        ``VAR=`` line looks like "unset" to its author: see :func:`empty_hint`.
        """
        if not text.strip():
            hint = empty_hint(self.name, text, f"the default ({self.unset})")
            msg = f"{self.name}={text!r} is not valid: expected {self.accepts}. {hint}"
        else:
            why = f"{reason}. Expected" if reason else "expected"
            msg = f"{self.name}={self.shown(text)!r} is not valid: {why} {self.accepts} (unset it for the default: {self.unset})"
        return self.error(msg)

    def __repr__(self) -> str:
        return f"<Var {self.name}>"


def empty_hint(name: str, text: str, unset_gives: str) -> str:
    """What to do about variable ``name`` set to the empty (or blank) ``text`` that its parser refused.

    A variable that is present counts as set, even when empty, so ``VAR=`` (an ``export VAR=``, an
    env file's ``VAR=`` line) does not give the default: the hint says so and how to unset it; the
    message it ends has already said which values the variable takes. The control variables' errors
    (:meth:`Var.refused`) and the settings' environment layer (``Setting.parse``) both use it.
    """
    what = "empty" if not text else f"blank ({text!r})"
    return (
        f"{name} is set but {what}, which is not the same as unset: remove it from the environment "
        f"('unset {name}', or delete its line from the env file) for {unset_gives}, or give it one of the values above"
    )


# --- parsers: each raises ValueError for a value it refuses ----------------------------------------


def switch(text: str) -> bool:
    """On or off, spelt as :data:`SWITCH_VALUES` says (surrounding blanks ignored); every ``bool`` setting parses with it too."""
    t = text.strip().lower()
    if t in _ON:
        return True
    if t in _OFF:
        return False
    raise ValueError(text)


def _names(text: str) -> tuple[str, ...]:
    """A comma list of names, blanks around them dropped; ``""`` is none."""
    return tuple(n for n in (p.strip() for p in text.split(",")) if n)


def _device_names(text: str) -> tuple[str, ...]:
    """Names of simulated devices; ``""`` simulates none, text naming none (``" , "``) is refused."""
    names = _names(text)
    if text and not names:
        raise ValueError(text)
    return names


def _one_name(text: str) -> str | None:
    """One name, blanks around it dropped; ``""`` is none; a comma list is refused (only one plugin can be pinned)."""
    t = text.strip()
    if "," in t:
        raise ValueError(text)
    return t or None


def _path(text: str) -> str | None:
    """A path as given; ``""`` is none (the default applies)."""
    return text or None


def _paths(text: str) -> tuple[str, ...]:
    """Paths separated by ``os.pathsep``, blank entries dropped."""
    return tuple(p for p in text.split(os.pathsep) if p.strip())


def _tune_mode(text: str) -> str:
    """``stale`` (tune what is stale at the first profile()) or ``off``; a switch's on is ``stale`` (the one mode)."""
    t = text.strip().lower()
    if t == "stale":
        return t
    return "stale" if switch(t) else "off"


REMOTE_FORMS = _storeurl.FORMS


def _remote_url(text: str) -> str | None:
    """A store URL as :func:`hwprofile._storeurl.check` accepts it (its secrets remembered for redaction); ``""`` is none."""
    return _storeurl.check(text, REMOTE_TIMEOUT.name) if text.strip() else None


def _seconds(text: str) -> float:
    """A number of seconds in (0, 60]."""
    v = float(text)
    if not 0 < v <= 60:
        raise ValueError(text)
    return v


def _present(text: str) -> bool:
    """Any non-empty value is on."""
    return bool(text)


# --- the variables -------------------------------------------------------------------------------

DEVICE: Final[Var[tuple[str, ...]]] = Var(
    PREFIX + "DEVICE",
    "simulate these GPUs instead of detecting the real ones (devices 0, 1, ... in order)",
    "comma-separated names of simulated devices: catalog names ('hwprofile devices' lists them) or capabilities as sm_XY / X.Y",
    _device_names, (), unset="the real GPUs", error=DeviceError,
)
PLUGIN: Final[Var[str | None]] = Var(
    PREFIX + "PLUGIN",
    "pin the architecture plugin that serves every device, instead of the one claiming its capability",
    "the name of one installed architecture plugin", _one_name, None, unset="the plugin claiming the device", error=PluginError,
)
PLUGIN_FORCE: Final[Var[bool]] = Var(
    PREFIX + "PLUGIN_FORCE",
    f"let {PREFIX}PLUGIN pin a plugin that does not claim the device (settings only: its kernels fall back)",
    f"one of {SWITCH_VALUES}", switch, False,
)
DISABLE_PLUGINS: Final[Var[tuple[str, ...]]] = Var(
    PREFIX + "DISABLE_PLUGINS",
    "plugins not to load (an unknown name warns, listing the installed ones)",
    "comma-separated names of installed plugins", _names, (), unset="every installed plugin loads",
)
CACHE: Final[Var[bool]] = Var(PREFIX + "CACHE", "the on-disk kernel cache", f"one of {SWITCH_VALUES}", switch, True)
CACHE_DIR: Final[Var[str | None]] = Var(
    PREFIX + "CACHE_DIR",
    f"where the kernel cache lives: a {os.pathsep!r} list, the last private writable directory written, the others read-only layers",
    f"a private directory for the kernel cache, or a {os.pathsep!r} list of layers", _path, None,
    unset="<user cache dir>/hwprofile/kernels",
)
NO_COMPILE: Final[Var[bool]] = Var(
    PREFIX + "NO_COMPILE",
    "forbid NVRTC compiles: a kernel in no cache layer is an error naming it and how to warm it (a serving process)",
    f"one of {SWITCH_VALUES}", switch, False,
)
CONFIG_DIR: Final[Var[str | None]] = Var(
    PREFIX + "CONFIG_DIR",
    "where the tuned files of each device are found, as tuned/<device>/*.toml",
    "a directory holding tuned/<device>/*.toml", _path, None, unset="<user config dir>/hwprofile",
)
TUNED_FILE: Final[Var[tuple[str, ...]]] = Var(
    PREFIX + "TUNED_FILE",
    "tuned-threshold files read after the device's tuned directory",
    f"tuned-threshold files separated by {os.pathsep!r}", _paths, (), unset="none",
)
STRICT: Final[Var[bool]] = Var(
    PREFIX + "STRICT",
    "raise instead of warning and falling back when a kernel fails or a tuned value is stale",
    f"one of {SWITCH_VALUES}", switch, False, setting="strict",
)
DETERMINISTIC: Final[Var[bool]] = Var(
    PREFIX + "DETERMINISTIC",
    "keep every op on its torch fallback (deterministic-inference mode)",
    f"one of {SWITCH_VALUES}", switch, False, setting="deterministic",
)
SELFTEST: Final[Var[bool]] = Var(
    PREFIX + "SELFTEST",
    "check every kernel a device can dispatch against float64 when an op first runs there (as 'hwprofile selftest'); "
    "stored verdicts whose stamps match are reused, a failing kernel is disabled with one warning",
    f"one of {SWITCH_VALUES}", switch, False, unset="off: kernels are not self-tested",
)
VERIFY: Final[Var[bool]] = Var(
    PREFIX + "VERIFY",
    "verify each kernel instance against float64 on its first use on a device (warm-up or the first eager call), before it "
    "serves a routed call; a failing instance disables its op's kernel there with one warning. off is your explicit choice: "
    "kernels nobody checked on this GPU then serve calls",
    f"one of {SWITCH_VALUES}", switch, True, setting="verify", unset="on: every instance without a passing verdict is verified",
)
TUNE: Final[Var[str]] = Var(
    PREFIX + "TUNE",
    "stale: the first profile() of a real GPU re-measures its stale or unmeasured thresholds before it returns (hwprofile.tune)",
    f"stale, or a switch ({SWITCH_VALUES}; on means stale)", _tune_mode, "off",
)
REMOTE: Final[Var[str | None]] = Var(
    PREFIX + "REMOTE",
    "a Redis store the hosts of a fleet share cubins and tuned tables through, read after the local layers "
    "(a miss compiles or tunes here and publishes); docs/fleet.md",
    REMOTE_FORMS, _remote_url, None, unset="none: every host compiles and tunes on its own", shown=redact,
)
REMOTE_TIMEOUT: Final[Var[float]] = Var(
    PREFIX + "REMOTE_TIMEOUT",
    "seconds one request to the remote store may take (connect, read); a store that does not answer in time is "
    "one warning, then the process is local-only",
    "a number of seconds, more than 0 and at most 60", _seconds, 1.0, unset="1 s",
)
TRACEBACK: Final[Var[bool]] = Var(
    PREFIX + "TRACEBACK",
    "the hwprofile command shows the traceback of an unexpected error instead of one line",
    "any non-empty value", _present, False, unset="off: one line",
)

#: Every control variable, in the order docs/architecture.md lists them: every reader iterates this.
VARS: Final[tuple[Var[Any], ...]] = (
    DEVICE, PLUGIN, PLUGIN_FORCE, DISABLE_PLUGINS, CACHE, CACHE_DIR, NO_COMPILE, CONFIG_DIR, TUNED_FILE, STRICT, DETERMINISTIC, SELFTEST,
    VERIFY, TUNE, REMOTE, REMOTE_TIMEOUT, TRACEBACK,
)
