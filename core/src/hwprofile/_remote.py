"""The fleet store: a Redis server through which hosts share cubins and tuned tables. Never trusts what it reads.

``HWPROFILE_REMOTE=redis://host:port[/db]`` (``rediss://`` for TLS, ``user:password@`` for
authentication: what redis-py's ``from_url`` takes) names it; the client, redis-py (the ``[remote]``
extra: ``pip install './core[remote]'``, :func:`install`), is imported only then. This module moves bytes and holds locks; it never
decides whether a value is good: callers verify every value exactly as they verify a file of theirs
(:func:`hwprofile.kernels.cache.read_remote` through the cache's ``decode``, :func:`hwprofile.tuned_layers.decode_tuned`
through the tuned-file checks), and a value that fails is skipped with one warning.

* **Keys** are versioned and namespaced (:data:`NAMESPACE`): ``hwprofile:1:cubin:<portable cache key>``
  and ``hwprofile:1:tuned:<device SKU>:<plugin>:<op>``; the fleet's tuning lock is
  ``hwprofile:1:lock:tune:<device SKU>:<plugin>``, its compile lock of one cubin
  ``hwprofile:1:lock:compile:<portable cache key>``. The cache key already hashes every compile input;
  a tuned value carries its stamp, judged by the stamp comparison a tuned file gets.
* **Bounded reads**: a value longer than the caller's limit is never transferred (a server-side
  script answers its length instead) and counts as rejected, with one warning.
* **A store that is down costs one bounded wait**: every request has the connect and read timeout
  ``HWPROFILE_REMOTE_TIMEOUT`` and no retry; the first fault is one warning, after which this
  process is local-only (no further connection) until ``hwprofile.reset()``.
* **Publishing is best effort**: a failed write is the same one warning; the value was used locally anyway.
* **The locks** (:class:`FleetLock`; one per SKU and plugin for tuning, one per cubin for compiling):
  ``SET key token NX PX ttl``, renewed by its holder every third of
  the ttl, released by a compare-and-delete script (only the holder's token); a killed holder's lock
  expires after :data:`LOCK_TTL_S`.

Counters (:func:`counters`): per kind of value (``cubin``, ``tuned``), hits, misses, rejected values and
publishes; store faults (``errors``). ``hwprofile show`` and ``hwprofile doctor`` print them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from . import _env, _state
from ._log import get_logger
from ._redact import redact

log = get_logger(__name__)

#: Version of the key schema: a change of what a key or value means takes a new number.
SCHEMA = 1
NAMESPACE = f"hwprofile:{SCHEMA}"
#: The largest cubin entry read from the store (bytes): the biggest shipped entry is under 1 MiB.
MAX_CUBIN_BYTES = 64 << 20
#: How long a fleet lock lives without its holder renewing it: what a killed holder costs the others.
LOCK_TTL_S = 30.0
KINDS = ("cubin", "tuned", "verdict")

# GET unless the value is longer than ARGV[1]: then its length (never transferred). nil when absent.
_BOUNDED_GET = """
local n = redis.call('STRLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return n end
return redis.call('GET', KEYS[1])
"""
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"


def slug(text: str) -> str:
    """``"NVIDIA H200 sm_90 141 GiB"`` -> ``"nvidia-h200-sm-90-141-gib"`` (a key part without blanks or colons)."""
    import re

    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def cubin_key(key: str) -> str:
    return f"{NAMESPACE}:cubin:{key}"


def tuned_key(device: str, plugin: str, op: str) -> str:
    """The key of one op's tuned table for a device SKU (``tuning.device_identity``) and plugin."""
    return f"{NAMESPACE}:tuned:{slug(device)}:{slug(plugin)}:{op}"


def tune_lock_key(device: str, plugin: str) -> str:
    return f"{NAMESPACE}:lock:tune:{slug(device)}:{slug(plugin)}"


def compile_lock_key(key: str) -> str:
    """The fleet's compile lock of one cubin (its portable cache key): one host compiles it, the others read what it publishes."""
    return f"{NAMESPACE}:lock:compile:{key}"


def verify_lock_key(digest_key: str) -> str:
    """The fleet's lock of one kernel instance's verification (its verdict key): one host checks it, the others read the verdict."""
    return f"{NAMESPACE}:lock:verify:{digest_key.rsplit(':', 1)[-1]}"


#: How long a host waits for another host's check of the same kernel instance before checking it itself (seconds).
VERIFY_WAIT_S = 60.0
VERIFY = ("verifying the same kernel instance on another host", "its verdict")
#: How long a host waits for another host's compile of the same cubin before compiling it itself (seconds): a live
#: holder renews its lock, so this bounds only a compile that hangs; a dead one costs :data:`LOCK_TTL_S`.
COMPILE_WAIT_S = 600.0
#: What a fleet lock is for, in the words its messages use: (what the holder does, what the others wait for).
TUNE = ("tuning the same SKU on another host", "its tables")
COMPILE = ("compiling the same kernel on another host", "its cubin")


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, dict[str, int]] = {k: {} for k in KINDS}
        self.errors = 0

    def note(self, kind: str, event: str, n: int = 1) -> None:
        with self.lock:
            c = self.counts[kind]
            c[event] = c.get(event, 0) + n


_counters = _Counters()
_EVENTS = ("hits", "misses", "rejected", "publishes")


def counters() -> dict[str, Any]:
    """``{"cubin": {hits, misses, rejected, publishes}, "tuned": {...}, "errors": n}`` of this process since the last reset."""
    with _counters.lock:
        out: dict[str, Any] = {k: {e: _counters.counts[k].get(e, 0) for e in _EVENTS} for k in KINDS}
        out["errors"] = _counters.errors
    return out


def note(kind: str, event: str) -> None:
    """Count a verdict the caller reached about a value (``rejected``: it failed the caller's checks)."""
    _counters.note(kind, event)


class Store:
    """One client of the store ``HWPROFILE_REMOTE`` names; every request bounded, the first fault ends its use."""

    def __init__(self, url: str, timeout_s: float, client: Any) -> None:
        self.url, self.timeout_s, self.client = url, timeout_s, client
        #: The URL with its password hidden: what messages, counters and ``show`` name.
        self.shown = redact(url)
        self._get = client.register_script(_BOUNDED_GET)
        self._release = client.register_script(_RELEASE)
        self._renew = client.register_script(_RENEW)

    @property
    def label(self) -> str:
        """The name the kernel pipeline's per-layer hit counters give this layer."""
        return f"{self.shown} (remote)"

    def _fault(self, what: str, exc: BaseException) -> None:
        global _down
        with _counters.lock:
            _counters.errors += 1
        _down = f"{type(exc).__name__}: {exc}"
        _warn_once(
            "down",
            "hwprofile: the remote store %s (%s) failed while %s (%s, timeout %g s); this process now uses its local kernel "
            "cache and tuned files only",
            self.shown, _env.REMOTE.name, what, _down, self.timeout_s,
        )

    def get_many(self, kind: str, keys: Sequence[str], limit: int, *, count: bool = True) -> dict[str, bytes]:
        """The values of ``keys`` no longer than ``limit`` bytes (absent ones left out; longer ones rejected with a warning).

        ``count``: note misses and rejections in the counters (off for a second look at a value already counted).
        """
        if not keys or _down is not None:
            return {}
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                self._get(keys=[key], args=[limit], client=pipe)
            got = pipe.execute(raise_on_error=False)  # a command's own error (a key of another type) comes back in its place
        except Exception as exc:  # noqa: BLE001 - any fault of the store or the client: local-only from now on
            self._fault(f"reading {kind} values", exc)
            return {}
        out: dict[str, bytes] = {}
        for key, value in zip(keys, got, strict=True):
            if value is None:
                if count:
                    _counters.note(kind, "misses")
            elif isinstance(value, Exception):
                if count:
                    _counters.note(kind, "rejected")
                _warn_once(
                    f"type:{key}", "hwprofile: remote %s entry %s in %s cannot be read (%s); it is skipped", kind, key, self.shown, value,
                )
            elif isinstance(value, int):
                if count:
                    _counters.note(kind, "rejected")
                _warn_once(
                    f"size:{key}", "hwprofile: remote %s entry %s in %s is %d bytes, over the %d-byte limit; it is not read",
                    kind, key, self.shown, value, limit,
                )
            else:
                out[key] = bytes(value)
        return out

    def get(self, kind: str, key: str, limit: int, *, count: bool = True) -> bytes | None:
        return self.get_many(kind, [key], limit, count=count).get(key)

    def put(self, kind: str, key: str, value: bytes) -> bool:
        """Store ``value`` under ``key`` (best effort: a fault is the one warning, then local-only)."""
        if _down is not None:
            return False
        try:
            self.client.set(key, value)
        except Exception as exc:  # noqa: BLE001 - publishing never fails the caller
            self._fault(f"publishing a {kind} value", exc)
            return False
        _counters.note(kind, "publishes")
        return True

    def ping(self) -> dict[str, Any]:
        """The server's version and one round trip's milliseconds; raises what the client raises (for ``doctor``)."""
        t0 = time.perf_counter()
        self.client.ping()
        ms = (time.perf_counter() - t0) * 1e3
        info = self.client.info("server")
        return {"version": str(info.get("redis_version", "?")), "ms": round(ms, 2)}

    def lock(self, key: str, ttl_s: float | None = None, purpose: tuple[str, str] = TUNE, *, quiet: bool = False) -> FleetLock:
        """The fleet lock ``key`` (:data:`TUNE` or :data:`COMPILE` says what for); ``quiet``: a wait is logged at info, not warning."""
        return FleetLock(self, key, LOCK_TTL_S if ttl_s is None else ttl_s, purpose, quiet=quiet)


class FleetLock:
    """One holder across the fleet: ``SET NX PX`` with a token, renewed while held, released only by its holder."""

    def __init__(self, store: Store, key: str, ttl_s: float, purpose: tuple[str, str] = TUNE, *, quiet: bool = False) -> None:
        import secrets
        import socket

        self.store, self.key, self.ttl_ms = store, key, max(1, int(ttl_s * 1e3))
        self.purpose, self.quiet = purpose, quiet
        self.token = f"pid {os.getpid()} on {socket.gethostname()} ({secrets.token_hex(4)})"
        #: Whether :meth:`acquire` found the lock held by another and waited.
        self.waited = False
        #: Who held it when this process last found it taken (the holder's token), or "".
        self.holder = ""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _try(self) -> bool | None:
        if _down is not None:
            return None
        try:
            if self.store.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                return True
            got = self.store.client.get(self.key)
        except Exception as exc:  # noqa: BLE001 - a store fault: the caller proceeds alone
            self.store._fault(f"taking the fleet lock {self.key}", exc)
            return None
        self.holder = got.decode(errors="replace") if isinstance(got, bytes) else str(got or "")
        return False

    def acquire(self, timeout_s: float) -> bool | None:
        """True once held; False when another holder still has it after ``timeout_s``; None when the store is unusable.

        Waits by polling, 50 ms doubling to 1 s; a holder that died stops renewing, so its lock
        expires after :data:`LOCK_TTL_S` and a waiter takes it.
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            got = self._try()
            if got is None:
                return None
            if got:
                self._renewer = threading.Thread(target=self._renew, name="hwprofile-fleet-lock", daemon=True)
                self._renewer.start()
                return True
            if not self.waited:
                self.waited = True
                (log.info if self.quiet else log.warning)(
                    "hwprofile: %s is held in the remote store %s by %s (%s); waiting up to %.0f s for %s",
                    self.key, self.store.shown, self.holder or "another process", self.purpose[0], timeout_s, self.purpose[1],
                )
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 1.0)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3e3):
            try:
                if not self.store._renew(keys=[self.key], args=[self.token, self.ttl_ms]):
                    log.warning("hwprofile: the fleet lock %s expired while this process held it; another host may do the same work",
                                self.key)
                    return
            except Exception:  # noqa: BLE001 - the lock then expires: at worst a duplicate tuning, never a wrong table
                return

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.store.timeout_s + 1)
            self._renewer = None
            if _down is None:
                try:
                    self.store._release(keys=[self.key], args=[self.token])
                except Exception as exc:  # noqa: BLE001 - the lock expires by itself
                    self.store._fault(f"releasing the fleet lock {self.key}", exc)


_store: Store | None = None
_down: str | None = None  # why the store is not used in this process (a fault, no client package), or None
_state_lock = threading.Lock()
_warned: set[str] = set()

def install() -> str:
    """The command that installs the ``[remote]`` extra (redis-py), from where hwprofile came (never by bare name)."""
    from ._install import hwprofile_extra

    return hwprofile_extra("remote")


def _warn_once(what: str, msg: str, *args: Any, error: bool = False) -> None:
    with _state_lock:
        if what in _warned:
            return
        _warned.add(what)
    (log.error if error else log.warning)(msg, *args)


def configured(environ: Mapping[str, str] | None = None) -> str | None:
    """The URL ``HWPROFILE_REMOTE`` names, or None (a refused value raises the variable's error)."""
    return _env.REMOTE.read(environ)


def store(environ: Mapping[str, str] | None = None) -> Store | None:
    """The store to use, or None: none configured, its client package missing (one error line), or it failed in this process."""
    global _store, _down
    url = configured(environ)
    if url is None or _down is not None:
        return None
    with _state_lock:
        if _store is not None and _store.url == url:
            return _store
    timeout = _env.REMOTE_TIMEOUT.read(environ)
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        _down = f"the redis package is not installed ({install()})"
        _warn_once(
            "import", "hwprofile: %s names a remote store, but its client, the redis package, is not installed: %s. Until then "
            "kernels and tuned tables stay local", _env.REMOTE.name, install(), error=True,
        )
        return None
    try:  # the URL was checked when read (hwprofile._storeurl); a client that still refuses it is a store fault, never a raise
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))
        made = Store(url, timeout, client)
    except Exception as exc:  # noqa: BLE001 - profile() and show must not fail on the store
        _down = f"the redis client refused the URL: {type(exc).__name__}: {exc}"
        _warn_once(
            "client", "hwprofile: %s=%s: %s; kernels and tuned tables stay local. Fix the URL (docs/fleet.md)",
            _env.REMOTE.name, redact(url), _down, error=True,
        )
        return None
    with _state_lock:
        _store = made
    return made


def status(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """What ``show`` prints of the remote layer: its URL (password hidden), state and counters; None when none is configured."""
    try:
        url = configured(environ)
    except Exception as exc:  # noqa: BLE001 - a refused value is reported where it is read; show still shows the rest
        return {"url": "?", "state": f"refused: {exc}", **counters()}
    if url is None:
        return None
    return {"url": redact(url), "state": "not used: " + _down if _down is not None else "in use", **counters()}


def describe(st: Mapping[str, Any]) -> str:
    """One line of :func:`status`'s counters."""

    def kind(k: str, what: str) -> str:
        c = st[k]
        return f"{what} {c['hits']} hit, {c['misses']} missed, {c['rejected']} rejected, {c['publishes']} published"

    return f"{kind('cubin', 'cubins')}; {kind('tuned', 'tuned tables')}; {st['errors']} store error(s)"


@_state.on_reset
def _forget() -> None:
    """A reset may change the environment: the next request connects again (and may warn again)."""
    global _store, _down
    with _state_lock:
        _store, _down = None, None
        _warned.clear()
    with _counters.lock:
        for c in _counters.counts.values():
            c.clear()
        _counters.errors = 0


@_state.in_forked_child
def _after_fork() -> None:
    global _store, _state_lock
    _state_lock = threading.Lock()
    _counters.lock = threading.Lock()
    _store = None  # the parent's connections are not the child's
