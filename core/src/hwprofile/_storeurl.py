"""The fleet store's URL (``HWPROFILE_REMOTE``), checked whole when the variable is read. Never connects, never imports redis.

redis-py's ``from_url`` reads more than it checks: ``?socket_timeout=abc`` or ``?db=x`` fails only
when the client is made, an unknown parameter only when it connects, and ``:Se/cret@`` (a raw ``/``
in the password) is read as a host named ``Se``. :func:`check` refuses each such URL with the
reason, naming the parameter, its value and what is accepted, so that ``profile()``, ``show`` and
``compile`` stop at the variable (``_env.REMOTE``'s error) instead of at the client. It accepts the
forms and parameters of :data:`PARAMS`, each read as redis-py reads it; the timeouts and retries
are refused, since the timeout variable (``_env.REMOTE_TIMEOUT``) bounds every request and hwprofile never retries.
Every secret of the URL is remembered by :mod:`hwprofile._redact` before anything is checked, so no
refusal can quote it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from urllib.parse import parse_qsl, unquote, urlsplit

from ._redact import remember_url

FORMS = (
    "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?PARAM=VALUE&...], rediss://... (TLS) or "
    "unix:///PATH/TO/SOCKET?db=DB&password=PASSWORD, as redis-py's from_url reads them "
    "(a '/', '?' or '#' in the password percent-encoded: %2F, %3F, %23)"
)

_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_FALSE = frozenset({"0", "false", "f", "no", "n"})


class Refused(ValueError):
    """A URL refused for :attr:`reason` (one sentence: what is wrong and what is accepted)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _count(least: int) -> Callable[[str], object]:
    def parse(text: str) -> object:
        if not text.isdigit() or int(text) < least:
            raise ValueError(text)
        return int(text)

    return parse


def _flag(text: str) -> object:
    t = text.lower()
    if t not in _TRUE | _FALSE:  # redis-py reads any other text as true ("off" too)
        raise ValueError(text)
    return t in _TRUE


def _one_of(*words: str) -> Callable[[str], object]:
    def parse(text: str) -> object:
        if text.lower() not in words:
            raise ValueError(text)
        return text.lower()

    return parse


def _text(text: str) -> object:
    return text


_FLAG = "1/0, true/false, yes/no"
#: Parameter -> (what it takes, its parser, TLS only): the query parameters accepted in the URL.
PARAMS: dict[str, tuple[str, Callable[[str], object], bool]] = {
    "db": ("a database number, 0 or more", _count(0), False),
    "password": ("the password", _text, False),
    "username": ("the user name (Redis ACLs)", _text, False),
    "client_name": ("a name for CLIENT LIST", _text, False),
    "health_check_interval": ("whole seconds, 0 or more", _count(0), False),
    "max_connections": ("a whole number, 1 or more", _count(1), False),
    "socket_read_size": ("bytes, 1 or more", _count(1), False),
    "socket_keepalive": (_FLAG, _flag, False),
    "protocol": ("2 or 3", _one_of("2", "3"), False),
    "ssl_cert_reqs": ("none, optional or required", _one_of("none", "optional", "required"), True),
    "ssl_check_hostname": (_FLAG, _flag, True),
    "ssl_certfile": ("a path", _text, True),
    "ssl_keyfile": ("a path", _text, True),
    "ssl_ca_certs": ("a path", _text, True),
    "ssl_ca_path": ("a path", _text, True),
    "ssl_password": ("the key file's password", _text, True),
}
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout", "timeout", "retry_on_timeout", "retry_on_error")


def _param(scheme: str, name: str, value: str, timeout_var: str) -> None:
    if name in _TIMEOUTS:
        raise Refused(
            f"parameter {name}={value!r} is not taken: hwprofile bounds every request to the store by {timeout_var} "
            f"(seconds) and never retries; remove it from the URL and set {timeout_var} instead"
        )
    known = PARAMS.get(name)
    if known is None:
        close = difflib.get_close_matches(name, [*PARAMS, *_TIMEOUTS], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise Refused(f"unknown parameter {name!r}: {hint}the URL takes {', '.join(PARAMS)}")
    what, parse, tls = known
    if tls and scheme != "rediss":
        raise Refused(f"parameter {name!r} applies to TLS only: use a rediss:// URL, or remove it")
    try:
        parse(value)
    except ValueError:
        raise Refused(f"parameter {name}={value!r} is not valid: {name} takes {what}") from None


def check(text: str, timeout_var: str) -> str:
    """``text`` (blanks around it dropped) when it is a store URL redis-py reads as meant; else :class:`Refused`.

    ``timeout_var`` names the variable that bounds each request (what a refused timeout parameter points to).
    """
    t = text.strip()
    remember_url(t)
    scheme, sep, rest = t.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("redis", "rediss", "unix"):
        raise Refused("the URL must start with redis://, rediss:// (TLS) or unix:// (a local socket)")
    user = rest.rpartition("@")[0]
    if any(c in user for c in "/?#"):
        raise Refused(
            "the part before the last '@' (user and password) holds a raw '/', '?' or '#', which redis-py reads as the end of "
            "the host: percent-encode them in the password (%2F, %3F, %23)"
        )
    u = urlsplit(t)
    try:
        port = u.port  # a port that is not a number in range raises ValueError
    except ValueError:
        raise Refused("the port is not a number from 0 to 65535") from None
    params = parse_qsl(u.query, keep_blank_values=True)
    names = [n for n, _v in params]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise Refused(f"parameter {twice[0]!r} is given twice")
    for name, value in params:
        _param(scheme, name, value, timeout_var)
    if scheme == "unix":
        if u.hostname or port is not None or not u.path.strip("/"):
            raise Refused("a unix:// URL names the socket's path and no host: unix:///run/redis.sock")
        return t
    if not u.hostname:
        raise Refused("the URL names no host")
    db = unquote(u.path).strip("/")
    if db and not db.isdigit():
        raise Refused(f"the database {db!r} (the path) is not a number: write /0, /1, ...")
    if db and "db" in names:
        raise Refused("the database is given twice, as the path and as ?db=: keep one")
    return t
