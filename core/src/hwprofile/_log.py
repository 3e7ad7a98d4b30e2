"""Loggers that import :mod:`logging` only when a record could be seen.

``profile()`` logs a debug line on every first call, and importing :mod:`logging` (with
``traceback``, ``string``, ``weakref``...) costs about 6 ms on the H200 machine: a third of the
first-profile budget. While no one has imported :mod:`logging`, no one has configured it either, so
the root logger is at WARNING and a debug or info record would be dropped; a warning or error would
reach logging's last-resort handler. :class:`LazyLogger` does exactly that without the import: it
drops debug/info records while :mod:`logging` is not loaded, and hands everything else (and
everything, once :mod:`logging` is loaded) to ``logging.getLogger(name)``. pytest's ``caplog`` and
an engine's logging configuration see every record, as with a plain logger.

Every record of a hwprofile logger passes :func:`hwprofile._redact.redact` (message and traceback)
before any handler sees it: :class:`_Redacting`, attached to each logger this module hands records
to, so no warning or error can print the fleet store's password.
"""

from __future__ import annotations

import sys
from typing import Any

from ._redact import redact


class _Redacting:
    """A logging filter: the record's message (arguments applied) and traceback text, redacted."""

    def filter(self, record: Any) -> bool:
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            import logging

            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_FILTER = _Redacting()


class LazyLogger:
    """A stand-in for ``logging.getLogger(name)`` (the methods library code here uses)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _logger(self) -> Any:
        import logging

        logger = logging.getLogger(self.name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
        return logger

    def _emit(self, level: str, msg: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2  # report the caller, not this wrapper
        getattr(self._logger(), level)(msg, *args, **kwargs)

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if "logging" in sys.modules:  # otherwise unconfigured: WARNING level, the record is dropped
            self._emit("debug", msg, args, kwargs)

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self._emit("info", msg, args, kwargs)

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._emit("warning", msg, args, kwargs)

    def error(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._emit("error", msg, args, kwargs)

    def __getattr__(self, attr: str) -> Any:  # isEnabledFor, exception, setLevel, ...
        return getattr(self._logger(), attr)

    def __repr__(self) -> str:
        return f"<LazyLogger {self.name}>"


def get_logger(name: str) -> LazyLogger:
    """The module logger for ``name`` (use ``get_logger(__name__)``)."""
    return LazyLogger(name)
