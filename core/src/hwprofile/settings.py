"""Typed settings and env defaults, resolved in layers that remember where each value came from.

Layers, lowest to highest: core default < architecture plugin < downstream plugins (pluggy order)
< tuned-thresholds file < the user's explicit ``HWPROFILE_*`` variable. A variable that is present
counts as set, even ``"0"`` or ``""``. Nothing here touches ``os.environ`` except
:func:`apply_env_defaults`, which only fills variables the user left unset. Never imports the
registry, the profiles or the kernel pipeline.

The core settings ``strict`` and ``deterministic`` are declared by their control variables'
records in :mod:`hwprofile._env` (:data:`CORE_SETTINGS` builds them from those), and a ``bool``
setting parses its variable with :func:`hwprofile._env.switch`, the parser of every on/off control
variable: one reading of on and off.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Literal, cast

from . import _env, _state
from ._record import Record, final
from .errors import SettingError

if TYPE_CHECKING:
    from .stamps import Stamp

#: A setting's type, as declared.
SettingType = Literal["bool", "int", "float", "str", "enum"]
#: Which layer supplied a value, lowest first.
LayerKind = Literal["core", "declared", "arch", "downstream", "tuned", "env"]

_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*\Z")
_TYPES = ("bool", "int", "float", "str", "enum")


@final
class Setting(Record):
    """A declared setting: key, type, default, bounds or choices, doc, and bit-identity.

    Constructing one checks it: an invalid key, type or default is a :class:`SettingError`.
    """

    #: Lower-case dotted name, ``"router_gemm.max_tokens"``; a plugin's keys start with its name.
    key: str
    #: The value's type; ``"enum"`` takes one of :attr:`choices`.
    type: SettingType
    #: Core's value, below every layer.
    default: Any
    #: One line for ``hwprofile explain``: what the setting decides.
    doc: str
    #: ``False`` when changing the value changes results bit for bit (e.g. summation order).
    bit_identical: bool = True
    #: Inclusive bounds of an ``"int"`` or ``"float"``; ``None`` is unbounded.
    minimum: float | None = None
    maximum: float | None = None
    #: The values of an ``"enum"``.
    choices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        key, type = self.key, self.type
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise SettingError(f"setting key {key!r} is invalid: use lower-case dotted names like 'router_gemm.max_tokens'")
        if type not in _TYPES:
            raise SettingError(f"setting {key}: type {type!r} is not one of {', '.join(_TYPES)}")
        if type == "enum" and not self.choices:
            raise SettingError(f"setting {key}: an enum needs choices")
        self.check(self.default, origin="its declared default")

    @property
    def env_var(self) -> str:
        """``HWPROFILE_`` (:data:`hwprofile._env.PREFIX`) + the key upper-cased, dots as underscores."""
        return _env.PREFIX + self.key.upper().replace(".", "_")

    def allowed(self) -> str:
        """Human description of the allowed values, for error messages."""
        if self.type == "bool":
            return f"a boolean ({_env.SWITCH_VALUES})"
        if self.type == "enum":
            return "one of " + ", ".join(self.choices or ())
        if self.type in ("int", "float"):
            def fmt(v: float) -> str:
                return str(int(v)) if self.type == "int" else f"{v:g}"

            lo = "-inf" if self.minimum is None else fmt(self.minimum)
            hi = "inf" if self.maximum is None else fmt(self.maximum)
            return f"{'an integer' if self.type == 'int' else 'a number'} in [{lo}, {hi}]"
        return "a string"

    def parse(self, text: str, *, origin: str) -> Any:
        """Parse a string (an env var or a TOML string) into a checked value."""
        t = text.strip()
        value: Any
        try:
            if self.type == "bool":
                value = _env.switch(t)
            elif self.type == "int":
                value = int(t, 10)
            elif self.type == "float":
                value = float(t)
            else:
                value = text
        except ValueError:
            value = None
        if value is None or not self._valid(value):
            msg = f"{origin}={text!r} is not valid for {self.key}: expected {self.allowed()}"
            if not t and origin.startswith(_env.PREFIX):  # the user's variable, set but empty: say what to do
                msg += ". " + _env.empty_hint(origin, text, f"the value the other layers give {self.key}")
            raise SettingError(msg)
        return self.check(value, origin=origin)

    def _valid(self, value: Any) -> bool:
        try:
            self.check(value, origin="")
        except SettingError:
            return False
        return True

    def check(self, value: Any, *, origin: str) -> Any:
        """Validate a typed value; an error names ``origin``, the key and the allowed values."""
        ok: bool
        if self.type == "bool":
            ok = isinstance(value, bool)
        elif self.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.type == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            value = float(value) if ok else value
        elif self.type == "enum":
            ok = isinstance(value, str) and value in (self.choices or ())
        else:
            ok = isinstance(value, str)
        if ok and self.type in ("int", "float"):
            ok = (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)
        if not ok:
            raise SettingError(f"{origin} gave {self.key}={value!r}, which is invalid: expected {self.allowed()}")
        return value


@final
class Value(Record):
    """A setting value with the reason it was chosen and, for a measured threshold, its stamp.

    ``stamp`` (a :class:`hwprofile.tuning.Stamp`) records what the value was measured against; the
    profile compares it with what is running and reports the value as stale when that changed.
    """

    #: The value itself, checked against the setting's declaration when the layer is added.
    value: Any
    #: Why this value (for a threshold: what it was measured against); shown by ``hwprofile explain``.
    reason: str = ""
    #: What a measured value was measured against (a ``Stamp``), or ``None``.
    stamp: Stamp | None = None


@final
class EnvDefault(Record):
    """An environment-variable default a plugin proposes, with the architecture reason for it."""

    #: The text to write when the user has not set the variable.
    value: str
    #: Why this architecture wants it.
    reason: str
    #: ``False`` when the variable changes results bit for bit.
    bit_identical: bool = True


@final
class Layer(Record):
    """One layer's contribution to a setting: which kind of layer, who, what value, and why.

    ``stale`` says what changed since the value was measured; a stale layer with ``applied=False``
    (a stale tuned value) stays in the chain for ``explain`` but does not win.
    """

    #: Which layer: ``core`` / ``declared`` (a declaration's default), ``arch``, ``downstream``, ``tuned``, ``env``.
    kind: LayerKind
    #: Who supplied it: ``"hwprofile-sm90 0.1.0"``, ``"tuned file <path>"``, ``"environment HWPROFILE_X"``.
    source: str
    value: Any
    reason: str = ""
    #: What the value was measured against, or ``None``.
    stamp: Stamp | None = None
    #: What changed since it was measured, in words; ``""`` when nothing did (or it was not measured).
    stale: str = ""
    #: ``False`` for a recorded value that does not win (a stale tuned value).
    applied: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "source": self.source,
            "value": self.value,
            "reason": self.reason,
            "stamp": self.stamp.as_dict() if self.stamp is not None else None,
            "stale": self.stale or None,
            "applied": self.applied,
        }


@final
class ResolvedSetting(Record):
    """A setting's final value and the whole chain of layers that produced it (winner last)."""

    setting: Setting
    #: Every layer, lowest first; at least the declaration's default, which is always applied.
    chain: tuple[Layer, ...]

    @property
    def value(self) -> Any:
        return self.winner.value

    @property
    def winner(self) -> Layer:
        return next(layer for layer in reversed(self.chain) if layer.applied)

    def as_dict(self) -> dict[str, Any]:
        s = self.setting
        return {
            "key": s.key,
            "value": self.value,
            "type": s.type,
            "source": self.winner.source,
            "kind": self.winner.kind,
            "stale": self.winner.stale or None,
            "doc": s.doc,
            "bit_identical": s.bit_identical,
            "env_var": s.env_var,
            "allowed": s.allowed(),
            "chain": [layer.as_dict() for layer in self.chain],
        }


@final
class ResolvedEnvDefault(Record):
    """An env default after layering, and whether the user already set the variable."""

    name: str
    value: str
    reason: str
    bit_identical: bool
    #: The plugin that proposed it (``"hwprofile-sm90 0.1.0"``).
    source: str
    #: The variable's value when the profile was resolved, ``None`` if unset.
    user_value: str | None = None

    @property
    def user_set(self) -> bool:
        return self.user_value is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "reason": self.reason,
            "bit_identical": self.bit_identical,
            "source": self.source,
            "user_set": self.user_set,
            "user_value": self.user_value,
        }


# --- core declarations ---------------------------------------------------------------------------


def _op_settings() -> tuple[Setting, ...]:
    """The ops' settings, declared once in the op table (``hwprofile.optable``)."""
    from .optable import setting_declarations

    return tuple(
        Setting(key, cast(Any, type_), default, doc, bit, lo, hi) for key, type_, default, doc, bit, lo, hi in setting_declarations()
    )


def _control_settings() -> tuple[Setting, ...]:
    """The core settings a control variable of :mod:`hwprofile._env` overrides, declared by its record."""
    return tuple(Setting(v.setting, "bool", v.default, v.doc) for v in _env.VARS if v.setting is not None)


CORE_SETTINGS: tuple[Setting, ...] = (*_control_settings(), *_op_settings())


# --- resolution ----------------------------------------------------------------------------------


class SettingsResolver:
    """Accumulates layers over declared settings and checks every value against its declaration."""

    def __init__(self) -> None:
        self.declared: dict[str, Setting] = {}
        self.declared_by: dict[str, str] = {}
        self.chains: dict[str, list[Layer]] = {}
        #: The key each declared setting's variable overrides, by variable name: one lookup per
        #: declaration finds a clash (a scan of every earlier declaration made declaring N settings
        #: cost N^2 / 2 ``env_var`` computations, 1.2 s of every first profile() at 2000 settings).
        self._by_env_var: dict[str, str] = {}

    def declare(self, settings: Iterable[Setting], *, by: str, namespace: str | None = None, source: str | None = None) -> None:
        """Add declarations; ``namespace`` (a plugin name) restricts the keys a plugin may declare.

        ``by`` names the declarer in errors (a plugin's label); ``source`` (default ``by``) is the
        declared default's provenance, spelt as the plugin's other layers spell it (its ``source``).
        """
        if isinstance(settings, (str, bytes, Mapping)) or not isinstance(settings, Iterable):
            raise SettingError(f"{by}: hwprofile_declare_settings must return a list of hwprofile.Setting, got {type(settings).__name__}")
        for s in settings:
            if not isinstance(s, Setting):
                raise SettingError(f"{by} declared {s!r}, which is not a hwprofile.Setting")
            if namespace is not None and not s.key.startswith(namespace + "."):
                raise SettingError(f"{by} declared {s.key!r} outside its namespace: plugin settings must start with '{namespace}.'")
            if s.key in self.declared:
                raise SettingError(f"setting {s.key!r} is declared twice: by {self.declared_by[s.key]} and by {by}")
            var = s.env_var
            clash = self._by_env_var.get(var)
            if clash is not None:
                raise SettingError(
                    f"settings {clash!r} (declared by {self.declared_by[clash]}) and {s.key!r} (declared by {by}) "
                    f"would both be set by {var}; rename one of them"
                )
            self._by_env_var[var] = s.key
            self.declared[s.key] = s
            self.declared_by[s.key] = by
            self.chains[s.key] = [Layer("core" if namespace is None else "declared", source or by, s.default, "declared default")]

    def current(self) -> dict[str, Any]:
        return {k: next(x for x in reversed(c) if x.applied).value for k, c in self.chains.items()}

    def add(
        self,
        kind: LayerKind,
        source: str,
        values: Mapping[str, Any] | None,
        *,
        who: str,
        check: Callable[[str, Stamp], str] | None = None,
        stamp: Stamp | None = None,
        drop_stale: bool = False,
    ) -> None:
        """Add one layer; ``who`` names the supplier in errors (plugin label, file path).

        ``check(key, stamp)`` returns what changed since a stamped value was measured ("" if
        nothing); with ``drop_stale`` a stale value is recorded but not applied.
        """
        if values is None:
            return
        if not isinstance(values, Mapping):
            raise SettingError(f"{who} returned {type(values).__name__} for settings; return a dict of key -> value")
        for key, raw in values.items():
            setting = self.declared.get(key)
            if setting is None:
                raise SettingError(f"{who} sets undeclared setting {key!r}; {unknown_key_hint(key, self.declared)}")
            reason, value_stamp = "", stamp
            if isinstance(raw, Value):
                if not isinstance(raw.reason, str):
                    raise SettingError(
                        f"{who} gives {key!r} a reason of type {type(raw.reason).__name__}; Value(value, reason) takes a str"
                    )
                if raw.stamp is not None and not _is_stamp(raw.stamp):
                    raise SettingError(
                        f"{who} gives {key!r} a stamp of type {type(raw.stamp).__name__}; pass a hwprofile.plugin.Stamp or None"
                    )
                raw, reason, value_stamp = raw.value, raw.reason, raw.stamp or stamp
            value = setting.check(raw, origin=who)
            stale = check(key, value_stamp) if (check is not None and value_stamp is not None) else ""
            self.chains[key].append(Layer(kind, source, value, reason, value_stamp, stale, not (stale and drop_stale)))

    def add_user_env(self, environ: Mapping[str, str]) -> None:
        """The top layer: every ``HWPROFILE_<KEY>`` present in the environment (even empty) counts."""
        for key, setting in self.declared.items():
            var = setting.env_var
            if var in environ:
                value = setting.parse(environ[var], origin=var)
                _check_format(key, value, var)
                self.chains[key].append(Layer("env", f"environment {var}", value, "set by the user"))

    def resolved(self) -> dict[str, ResolvedSetting]:
        return {k: ResolvedSetting(self.declared[k], tuple(c)) for k, c in sorted(self.chains.items())}


def _is_stamp(obj: object) -> bool:
    from .stamps import Stamp

    return isinstance(obj, Stamp)


def apply_env_defaults(defaults: Mapping[str, ResolvedEnvDefault], environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Write each default the user has not set into ``environ``; return exactly what was written."""
    env = os.environ if environ is None else environ
    written: dict[str, str] = {}
    for name, d in defaults.items():
        if name not in env:
            env[name] = d.value
            written[name] = d.value
    return written


# --- control variables and typos -----------------------------------------------------------------

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_warned_vars: set[str] = set()


def unknown_key_hint(key: str, known: Iterable[str]) -> str:
    """What to say about an unknown setting ``key``: the closest declared one ("did you mean"), and where the list is."""
    import difflib  # only for a typo: not on every profile()

    keys = sorted(known)
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}'hwprofile explain --list' lists the {len(keys)} settings: {', '.join(keys)}"


def _check_format(key: str, value: Any, var: str) -> None:
    """An op's ``<op>.model`` or ``<op>.measured`` text from the user's variable ``var``, parsed now (once, when
    the variable is read) so that garbage stops ``profile()`` and ``show`` naming ``var``, not the first routed call."""
    op, _, field = key.rpartition(".")
    if not value or field not in ("model", "measured"):
        return
    from .optable import TABLE

    if op not in TABLE:
        return
    try:
        if field == "model":
            from . import costmodel

            costmodel.parse(op, value, where=var)
        else:
            from . import tuning

            tuning.parse_measured(op, value, where=var)
    except SettingError as exc:
        raise SettingError(f"{exc}: fix {var}, or unset it for the value the other layers give {key}") from None


def check_environment(environ: Mapping[str, str], setting_vars: Iterable[str]) -> list[str]:
    """Reject invalid control values; warn once per unknown ``HWPROFILE_*`` variable, naming the closest known one.

    Every control variable of :data:`hwprofile._env.VARS` is read, so a refused value is one error
    naming the variable and its accepted values. Returns the warnings given now (for tests).
    ``setting_vars`` are the env names of every declared setting.
    """
    for var in _env.VARS:
        var.read(environ)
    known = sorted({*(v.name for v in _env.VARS), *setting_vars})
    given = []
    for name in sorted(environ):
        if not name.startswith(_env.PREFIX) or name in known or name in _warned_vars:
            continue
        _warned_vars.add(name)
        import difflib  # only for a typo: not on every profile()

        from ._log import get_logger

        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "no hwprofile setting or control variable has that name"
        msg = f"hwprofile: unknown environment variable {name} is ignored; {hint} (hwprofile show lists every setting)"
        get_logger(__name__).warning(msg)
        given.append(msg)
    return given


def check_env_default(name: Any, value: Any, *, who: str) -> None:
    """An env default a plugin proposes must be safe to ``export``: a strict identifier, a string value without NUL."""
    if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
        raise SettingError(
            f"{who} proposes an env default named {name!r}, which is not a valid variable name "
            "(letters, digits and _, not starting with a digit)"
        )
    if name.startswith(_env.PREFIX):
        raise SettingError(f"{who} proposes an env default for {name}: hwprofile's own variables are the user's; return settings instead")
    if isinstance(value, str) and "\0" in value:
        raise SettingError(f"{who}: env default {name} contains a NUL character, which no environment can hold")


@_state.on_reset
def clear_cache() -> None:
    """Forget which unknown variables were warned about (``hwprofile.reset()`` calls it)."""
    _warned_vars.clear()
