"""The one redaction of secrets: every text hwprofile prints, logs or raises passes :func:`redact`. Never imports anything of hwprofile.

A secret reaches an output in two ways, and :func:`redact` hides both:

* **inside a URL**, in any form redis-py's ``from_url`` reads (and other URL-shaped values, such as
  a ``TORCHINDUCTOR_REDIS_URL`` that ``doctor`` lists): the password of ``user:PASSWORD@`` or
  ``:PASSWORD@`` (everything between ``://`` and the *last* ``@`` of the URL is the user part, so a
  raw ``/``, ``?`` or ``@`` in the password, common in base64, is hidden with it), a user part with
  no ``:`` (``PASSWORD@host``: whole), and the value of a ``password=`` query parameter
  (``?password=PW``, ``unix:///run/redis.sock?password=PW``); percent-encoded or not;
* **anywhere else**, once the secret is known: :func:`remember` records the password of the URL a
  control variable names when it is read (``_env.REMOTE``), in its written and its decoded form, and
  :func:`redact` replaces every occurrence, so a client error that quotes the password, or a
  message that quotes a fragment of a URL, shows ``***`` instead. Secrets shorter than
  :data:`MIN_REMEMBERED` characters are hidden only inside URLs (replacing every ``"a"`` would
  garble the output and hide nothing: a one-letter password is no secret).

Where it runs: :mod:`hwprofile.errors` redacts the message of every :class:`~hwprofile.errors.HwprofileError`,
:mod:`hwprofile._log` every log record (message and traceback) of every hwprofile logger,
:func:`hwprofile.cli.main` everything the command writes to stdout and stderr (``show``,
``show --json``, ``doctor``, ``explain``, error lines), and ``warnings.warn`` texts the ops emit
pass through the same log and CLI paths. ``tests/package/test_redact.py`` plants a secret in every
URL form and scans each of those outputs.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

#: What a hidden secret is written as.
MASK = "***"
#: The shortest secret :func:`remember` hides outside URLs (shorter ones only inside URLs).
MIN_REMEMBERED = 4

# A URL: a scheme, "://", then everything up to a blank or a quote (a message quotes a value in '...' or "...").
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^\s'\"`<>]*)")
# A password given as a query parameter (any case), up to the next parameter.
_QUERY_PASSWORD = re.compile(r"(?i)([?&;](?:password|passwd|pwd|auth|token)=)[^&;#\s'\"`<>]*")

#: What docs and messages write where a password goes: shown as it is (no secret).
PLACEHOLDERS = frozenset({"PASSWORD", MASK})

_known: set[str] = set()
_lock = threading.Lock()


def _query(m: re.Match[str]) -> str:
    value = m.group(0)[len(m.group(1)) :]
    return m.group(0) if value.rstrip(",.;:)]") in PLACEHOLDERS else m.group(1) + MASK


def _url(match: re.Match[str]) -> str:
    scheme, rest = match.group(1), match.group(2)
    rest = _QUERY_PASSWORD.sub(_query, rest)
    user, at, host = rest.rpartition("@")
    if not at or not user:
        return scheme + rest
    name, colon, password = user.partition(":")
    if (password if colon else name).strip("[]") in PLACEHOLDERS:
        return scheme + rest
    if not colon:  # "SECRET@host": a user part alone is often a password written without its colon
        return f"{scheme}{MASK}@{host}"
    return f"{scheme}{name}:{MASK}@{host}"


def redact(text: str) -> str:
    """``text`` with every password in a URL and every remembered secret replaced by :data:`MASK`."""
    if not text:
        return text
    if "://" in text:
        text = _URL.sub(_url, text)
    if _known:
        with _lock:
            known = sorted(_known, key=len, reverse=True)  # a longer secret first: one that contains another is hidden whole
        for secret in known:
            if secret in text:
                text = text.replace(secret, MASK)
    return text


def remember(secret: str) -> None:
    """Hide ``secret`` (and its percent-decoded form) in every later output, wherever it appears."""
    for form in (secret, unquote(secret)):
        if len(form) >= MIN_REMEMBERED:
            with _lock:
                _known.add(form)


def secrets_of_url(url: str) -> tuple[str, ...]:
    """The secrets a URL carries, as written: the password of its user part (or the user part
    without a ``:``) and every ``password=`` query value. A raw ``/`` in the password is part of it."""
    out: list[str] = []
    for m in _URL.finditer(url):
        rest = m.group(2)
        for q in _QUERY_PASSWORD.finditer(rest):
            value = rest[q.end(1) : q.end()]
            if value and value.rstrip(",.;:)]") not in PLACEHOLDERS:
                out.append(value)
        user, at, _host = _QUERY_PASSWORD.sub("", rest).rpartition("@")
        if at and user:
            name, colon, password = user.partition(":")
            secret = password if colon else name
            if secret.strip("[]") not in PLACEHOLDERS:
                out.append(secret)
    return tuple(s for s in out if s)


def remember_url(url: str) -> None:
    """:func:`remember` every secret ``url`` carries (called where a control variable naming a URL is read)."""
    for secret in secrets_of_url(url):
        remember(secret)


class RedactingStream:
    """A text stream that writes through another one, every text :func:`redact`-ed first (the CLI's stdout and stderr)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(redact(text))
        return len(text)  # what the caller wrote, as print() and argparse expect

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, errors, buffer, ...
        return getattr(self.stream, name)


@contextmanager
def redacted_output() -> Iterator[None]:
    """While inside, ``sys.stdout`` and ``sys.stderr`` write through :class:`RedactingStream` (restored after)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(out), RedactingStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
