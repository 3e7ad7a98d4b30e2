"""The exchange over the engine's torch.distributed group: never a transport of its own, never torch at import.

:func:`check_agreement` is one protocol whose every exit is the same on every rank of the group:

1. **Arrival, in the group's store** (keys scoped to the group and to this call's number). Each rank
   marks itself (``a<rank>``), then adds 1 to the call's counter ``n``; the rank whose add returns
   the group's size is the last and sets ``go``; the others wait for ``go`` up to the timeout. A rank
   whose wait ends adds :data:`_ABORT` to the counter: that add is ordered against every arrival by
   the store, so either every rank had arrived before it (the abort is void: ``go`` follows) or no
   rank can ever see ``go`` (an arrival after it returns at least ``_ABORT`` and raises at once, "you
   are late"). No collective is issued unless every rank arrived, so a timeout leaves nothing in
   flight for a late rank, or the engine's next collective, to pair with; the wait honours any
   timeout, also one longer than the process group's own, and names exactly the ranks whose mark
   was absent.
2. **One all_gather** of a fixed 128-byte record per rank (:data:`RECORD_BYTES`): the protocol
   version, whether this rank could take part (its profile, its arguments), the arguments themselves
   (``mixed``, ``gather``, ``timeout``), a SHA-256 over every compared value and the fingerprint, and
   the host, device index, local rank and fingerprint for the table.
3. Only when the records show anything other than equal digests and equal arguments (or with
   ``gather=True``, or mixed models) does every rank gather every rank's full summary, or the error
   that stopped it (lengths, then one padded byte all_gather), to name keys, values, provenance,
   ranks and hosts. Every rank decides on the same gathered records, so every rank issues the same
   collectives and reaches the same verdict.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import socket
import struct
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from .. import _state
from .._log import get_logger
from ..errors import AgreementError, HwprofileError
from ._compare import MIXED_CHOICES, Agreement, _check_mixed, _message, _who, compare
from ._summary import RankSummary, _local, _local_rank, disabled_plugins, resolve_device

if TYPE_CHECKING:
    from ..profiles import Profile

log = get_logger("hwprofile.distributed")  # the package's logger, as before it was split into modules

# version, status, mixed, gather, timeout (NaN: None), device index, local rank, digest, fingerprint (text), host (utf-8, cut)
_RECORD: Final = struct.Struct("<BBBBdhh32s16s64s")
RECORD_BYTES: Final = _RECORD.size  # 128
_PROTOCOL: Final = 2  # the record's layout and the store protocol; 1 was hwprofile <= 0.1's store-less gather
_OK, _NO_PROFILE, _BAD_ARGUMENTS = 0, 1, 2  # a record's status
_MIXED_CODE: Final = {m: i for i, m in enumerate(MIXED_CHOICES)}
_MIXED_INVALID: Final = 255
_ABORT: Final = 1 << 40  # what a rank that gives up adds to the arrival counter (more than any group has ranks)
_STORE_CHUNK_S: Final = 60.0  # one store wait at most this long (an infinite timeout waits chunk by chunk)
_SETTLE_S: Final = 5.0  # how long a rank waits for a marker another rank sets right after its own store operation
_DEFAULT_PG_S: Final = 1800.0  # torch's default for gloo, when a group does not say

_calls: dict[str, int] = {}  # checks per group in this process: numbers the store keys, in step on every rank


def _seconds(timeout: object) -> float | None:
    """``timeout=`` as seconds (``math.inf`` allowed), None for the process group's own; a clear error for anything else."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, timedelta)):
        raise ValueError(
            f"check_agreement(timeout={timeout!r}): give a number of seconds (float('inf') waits without a limit) "
            "or None for the process group's timeout"
        )
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if math.isnan(s) or not s > 0:
        raise ValueError(
            f"check_agreement(timeout={timeout!r}): give a positive number of seconds (float('inf') waits without a limit), "
            "or None for the process group's timeout"
        )
    return s


def _arguments(mixed: object, timeout: object, gather: object) -> tuple[float | None, list[str]]:
    """The timeout in seconds and what is wrong with the arguments (empty: nothing)."""
    problems = []
    try:
        _check_mixed(mixed)
    except ValueError as exc:
        problems.append(str(exc))
    if not isinstance(gather, bool):
        problems.append(f"check_agreement(gather={gather!r}): give True or False")
    wait_s = None
    try:
        wait_s = _seconds(timeout)
    except ValueError as exc:
        problems.append(str(exc))
    return wait_s, problems


def _span(s: float) -> str:
    """Seconds as people read them: ``"2 s"``, ``"1.25 s"``, ``"1800 s"``, or ``"without a limit"``."""
    return "without a limit" if math.isinf(s) else f"{s:.3g} s" if s < 100 else f"{s:.0f} s"


def check_agreement(
    group: Any = None,
    *,
    device: int | None = None,
    mixed: str = "error",
    timeout: float | timedelta | None = None,
    gather: bool = False,
) -> Agreement:
    """Check that every rank of ``group`` (default: the world) resolved the same profile.

    Call it on every rank of the group, after ``init_process_group`` (and ``torch.cuda.set_device``)
    and before the first forward. It compares plugin identities and versions, every resolved
    setting, env defaults, kernel source digests, the NVRTC and torch versions, the
    deterministic/strict modes and the GPU model. ``mixed="allow"`` accepts different GPU models
    when everything that does not follow from the model agrees. ``timeout`` (seconds, or a
    timedelta; ``float('inf')``: no limit) bounds the wait for the other ranks (default: the process
    group's timeout); a longer one than the group's is honoured (the wait is in the store).
    ``gather=True`` always gathers every rank's full summary (the bring-up command does). Every rank
    must pass the same ``mixed``, ``timeout`` and ``gather``: they are exchanged, and a difference is
    an error on every rank.

    Returns an :class:`Agreement` on every rank, or raises :class:`hwprofile.AgreementError` on every
    rank: when the profiles differ (naming each differing key, its values, their provenance and the
    ranks and hosts holding each), when the arguments differ, when a rank could not resolve its
    profile (quoting its error), or when a rank did not arrive within ``timeout`` (naming it; a rank
    arriving after another gave up raises at once).
    """
    wait_s, problems = _arguments(mixed, timeout, gather)
    t0 = time.perf_counter()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise HwprofileError(f"check_agreement needs torch with torch.distributed ({exc})") from None
    if not dist.is_available() or not dist.is_initialized():
        if problems:
            raise ValueError(problems[0])
        raise HwprofileError(
            "check_agreement: torch.distributed is not initialised in this process; call torch.distributed.init_process_group() "
            "first (or run the bring-up check: torchrun --nproc-per-node N -m hwprofile.distributed)"
        )
    from ..profiles import profile

    info = _group_info(dist, group)
    ranks, me = info.ranks, info.me
    if len(ranks) == 1:
        if problems:
            raise ValueError(problems[0])
        index = resolve_device(device, cuda_backend=info.cuda)
        mine = _prepare(torch, info, index, profile(index)).mine
        return Agreement((mine,), {mine.model: (me,)}, str(mixed), gathered=True, seconds=time.perf_counter() - t0)

    seq = _calls[info.tag] = _calls.get(info.tag, 0) + 1  # before anything that can fail: every rank numbers every call
    prep: _Prepared | None = None
    failure: BaseException | None = None
    try:
        index = resolve_device(device, cuda_backend=info.cuda)
        prep = _prepare(torch, info, index, profile(index))
    except Exception as exc:  # noqa: BLE001 - this rank still takes part, and every rank quotes its error
        failure = exc
    status = _BAD_ARGUMENTS if problems else _NO_PROFILE if failure is not None else _OK
    waited = info.pg_s if wait_s is None else wait_s
    inp, out = _buffers(torch, info, prep, status, mixed, gather, wait_s)
    store = _store(dist)
    key = f"hwprofile/agreement/{info.tag}/{seq}/"
    _arrive(store, key, me, ranks, waited, wait_s is None)

    # Every rank arrived: the collectives below run on every rank, in the same number and order.
    deadline_s = min(max(waited, 5.0), info.pg_s)
    raw = _gather_records(dist, info, inp, out, deadline_s, me)
    if prep is not None and raw == prep.raw and not gather:  # the same answer as last time on this group: every rank agreed then
        return Agreement(prep.summaries, {prep.mine.model: ranks}, str(mixed), gathered=False, seconds=time.perf_counter() - t0)
    records = [_RECORD.unpack_from(raw, i * RECORD_BYTES) for i in range(len(ranks))]
    versions = {r[0] for r in records}
    if versions != {_PROTOCOL}:
        odd = [rank for rank, r in zip(ranks, records, strict=True) if r[0] != _PROTOCOL]
        raise AgreementError(
            f"hwprofile: check_agreement: {_who(odd)} of the {len(ranks)} ranks speak{'s' * (len(odd) == 1)} another version of the "
            f"agreement exchange (record version {', '.join(str(r[0]) for r in records if r[0] != _PROTOCOL)}, this rank's "
            f"{_PROTOCOL}): they run another hwprofile. Install the same hwprofile on every rank (every rank raises this error)."
        )
    arguments = {raw[i * RECORD_BYTES + 2 : i * RECORD_BYTES + 12] for i in range(len(ranks))}
    statuses = {r[1] for r in records}
    digests = {r[7] for r in records}
    if statuses == {_OK} and len(arguments) == 1 and len(digests) == 1 and not gather and prep is not None:
        prep.summaries = tuple(
            prep.mine.replace(
                rank=rank,
                host=_text(r[9]),
                local_rank=None if r[6] < 0 else r[6],
                device_index=r[5],
                fingerprint=_text(r[8]),
            )
            for rank, r in zip(ranks, records, strict=True)
        )
        prep.raw = raw
        return Agreement(prep.summaries, {prep.mine.model: ranks}, str(mixed), gathered=False, seconds=time.perf_counter() - t0)

    payload = _payload(prep, failure, problems)
    wires = _gather_details(torch, dist, info, payload, out.device, deadline_s, me)
    summaries, errors = _decode(wires, ranks, records)
    if errors or len(arguments) > 1:
        msg = _refusal(errors, summaries, records, ranks)
        raise AgreementError(msg, ranks=summaries) from failure
    diffs, models = compare(summaries, str(mixed))
    if diffs:
        msg = _message(diffs, summaries, models, str(mixed))
        raise AgreementError(msg, differences=tuple(diffs), ranks=summaries)
    agreement = Agreement(summaries, models, str(mixed), gathered=True, seconds=time.perf_counter() - t0)
    if len(models) > 1 and me == ranks[0]:
        log.warning(
            "%s. Kernels and thresholds follow each model, so results differ between the models in the last bits; everything else agrees.",
            agreement.describe(),
        )
    return agreement


def _text(b: bytes) -> str:
    return b.rstrip(b"\0").decode(errors="replace")


# --- step 1: arrival in the store ---------------------------------------------------------------------


def _store(dist: Any) -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception as exc:  # noqa: BLE001 - a group without a store cannot time out symmetrically
        raise HwprofileError(
            f"check_agreement: the process group has no store to meet in ({type(exc).__name__}: {exc}); "
            "initialise it with init_process_group (env://, tcp:// or file://, or store=)"
        ) from None


def _arrive(store: Any, key: str, me: int, ranks: Sequence[int], wait_s: float, default: bool) -> None:
    """Return when every rank of the group has arrived; raise :class:`AgreementError` (on every rank that arrived) otherwise."""
    size = len(ranks)
    t0 = time.monotonic()
    try:
        store.set(f"{key}a{me}", "")  # before the count: a rank counted as arrived has its mark
        n = int(store.add(key + "n", 1))
        if n == size:
            store.set(key + "go", "")
            return
        if n >= _ABORT:  # a rank gave up before this one arrived
            raise _late_error(store, key, me, ranks)
        if _wait(store, key + "go", t0 + wait_s):
            return
        n = int(store.add(key + "n", _ABORT))
        arrived, aborts = n % _ABORT, n // _ABORT
        if aborts == 1 and arrived < size:  # this rank's abort is the one that counts
            waited = time.monotonic() - t0
            missing = [r for r in ranks if not store.check([f"{key}a{r}"])]
            store.set(key + "abort", f"rank {me} gave up after waiting {_span(waited)}")
            raise _missing_error(me, ranks, missing, wait_s, waited, default)
        # every rank had arrived before this abort (go is on its way), or another rank's abort decided first
        outcome = _settle(store, key)
        if outcome == "go":
            return
        missing = [r for r in ranks if not store.check([f"{key}a{r}"])]
        raise _missing_error(me, ranks, missing, wait_s, time.monotonic() - t0, default, outcome)
    except AgreementError:
        raise
    except Exception as exc:  # a store that does not answer: say so, on every rank it happens to
        cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        host = _rank0_store(store)
        if host is not None and me != 0:  # the store lived in rank 0's process: rank 0 is the one gone
            raise AgreementError(
                f"hwprofile: check_agreement on rank {me}: rank 0 is gone (or unreachable): the job's store ({host}), which "
                f"lives in rank 0's process (init_process_group without torchrun), stopped answering while the {size} ranks met "
                f"({cause}). "
                "Rank 0 exited (it crashed, raised or returned) before or during the check; its own output says why. Every "
                "other rank raises this error; no collective was issued. Under torchrun the agent holds the store instead.",
                missing=(0,),
            ) from exc
        raise AgreementError(
            f"hwprofile: check_agreement on rank {me}: the process group's store did not answer while the {size} ranks met "
            f"({cause}). The job's rendezvous (MASTER_ADDR/MASTER_PORT, the torchrun agent, or the init_method's file) is gone "
            "or unreachable."
        ) from exc


def _rank0_store(store: Any) -> str | None:
    """``"HOST:PORT"`` when the group's store is a TCPStore served from rank 0's process (no torchrun agent holds it), else None.

    ``init_process_group`` without torchrun (``env://``, ``tcp://``) starts the TCPStore server in rank 0; torchrun's
    agent sets ``TORCHELASTIC_USE_AGENT_STORE=True`` and serves it from the agent, which outlives the ranks.
    """
    s = store
    for _ in range(8):  # PrefixStore around the TCPStore (the default group's "default_pg" prefix)
        inner = getattr(s, "underlying_store", None)
        if inner is None:
            break
        s = inner
    if type(s).__name__ != "TCPStore" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    try:
        return f"a TCPStore at {s.host}:{s.port}"
    except Exception:  # noqa: BLE001 - only for the message
        return "a TCPStore"


def _wait(store: Any, key: str, deadline: float) -> bool:
    """Whether ``key`` appeared before ``deadline`` (monotonic); an infinite deadline waits chunk by chunk."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bool(store.check([key]))
        chunk = min(left, _STORE_CHUNK_S)
        started = time.monotonic()
        try:
            store.wait([key], timedelta(seconds=chunk))
            return True
        except Exception:  # a store's wait timeout (DistStoreError; RuntimeError from a FileStore)
            if store.check([key]):
                return True
            if time.monotonic() - started < chunk - 0.5:  # it gave up well before its time: the store failed, not a timeout
                raise


def _settle(store: Any, key: str) -> str:
    """After a void or second abort: ``"go"``, or the first abort's marker (set right after its decisive add)."""
    end = time.monotonic() + _SETTLE_S
    while time.monotonic() < end:
        if store.check([key + "go"]):
            return "go"
        if store.check([key + "abort"]):
            return str(store.get(key + "abort").decode(errors="replace"))
        time.sleep(0.01)
    return "another rank gave up, or a rank died between arriving and signalling"


def _late_error(store: Any, key: str, me: int, ranks: Sequence[int]) -> AgreementError:
    end = time.monotonic() + _SETTLE_S
    who = "another rank had given up waiting"
    while time.monotonic() < end:
        if store.check([key + "abort"]):
            who = str(store.get(key + "abort").decode(errors="replace"))
            break
        time.sleep(0.01)
    return AgreementError(
        f"hwprofile: check_agreement on rank {me} arrived after the check of the {len(ranks)} ranks of its group had ended "
        f"({who}, raising AgreementError). Every rank raises; none returns. Call check_agreement on every "
        "rank at the same point (after loading), or pass a timeout= that covers the spread of the ranks' arrivals.",
        missing=(me,),
    )


def _missing_error(
    me: int, ranks: Sequence[int], missing: Sequence[int], wait_s: float, waited: float, default: bool, decided: str = ""
) -> AgreementError:
    limit = f"the process group's timeout ({_span(wait_s)})" if default else f"timeout={_span(wait_s)}"
    arrived = [r for r in ranks if r not in missing]
    if missing:
        who = f"{_who(missing)} had not called check_agreement ({_who(arrived)} had)"
    else:
        who = f"every rank arrived, but {decided}" if decided else "every rank had marked its arrival, but not every rank was counted"
    why = f" ({decided})" if decided and missing else ""
    return AgreementError(
        f"hwprofile: check_agreement on rank {me} waited {_span(waited)} ({limit}) for the {len(ranks)} ranks of its group: {who}{why}. "
        "Every rank that arrived raises this error, and a rank arriving later raises at once; no collective was issued. Every rank "
        "must call check_agreement after init_process_group and before the first forward; a rank that is still loading, crashed, "
        "or skipped the call would hang the job at its first collective. Raise timeout= if ranks legitimately arrive later.",
        missing=tuple(missing),
    )


# --- steps 2 and 3: the collectives, once every rank arrived ----------------------------------------------


def _gather_records(dist: Any, info: _GroupInfo, inp: Any, out: Any, bound_s: float, me: int) -> bytes:
    gather_one = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    try:
        work = gather_one(out, inp, group=info.group(), async_op=True)
        work.wait(timedelta(seconds=bound_s))
        host_out = out.cpu()  # NCCL: waits for the gather; gloo: the same tensor
        return ctypes.string_at(host_out.data_ptr(), host_out.numel())  # contiguous uint8; no numpy, no per-byte loop
    except Exception as exc:  # every rank had arrived: a rank died (or its transport broke) since
        raise _exchange_error(info, me, exc) from exc


def _gather_details(torch: Any, dist: Any, info: _GroupInfo, payload: bytes, dev: Any, bound_s: float, me: int) -> list[bytes]:
    try:
        return _gather_bytes(torch, dist, info.group(), payload, dev, len(info.ranks), bound_s)
    except Exception as exc:  # as above
        raise _exchange_error(info, me, exc) from exc


def _exchange_error(info: _GroupInfo, me: int, exc: BaseException) -> AgreementError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return AgreementError(
        f"hwprofile: check_agreement on rank {me}: all {len(info.ranks)} ranks of its group arrived, but the exchange failed "
        f"on this rank ({first}): a rank probably died or lost its connection during the check. Look for the rank that "
        "exited first in the launcher's log."
    )


def _gather_bytes(torch: Any, dist: Any, group: Any, payload: bytes, dev: Any, size: int, bound_s: float | None = None) -> list[bytes]:
    """Every rank's ``payload``, in group order: lengths, then one padded uint8 all_gather (each bounded by ``bound_s``).

    Not ``all_gather_object``: torch's object collectives need numpy, which engines need not have
    (torch does not require it), and the bring-up command always takes this path.
    """

    def run(outs: list[Any], inp: Any) -> None:
        work = dist.all_gather(outs, inp, group=group, async_op=True)
        if bound_s is None:
            work.wait()
        else:
            work.wait(timedelta(seconds=bound_s))

    n = torch.tensor([len(payload)], dtype=torch.int64, device=dev)
    lengths = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(size)]
    run(lengths, n)
    sizes = [int(t.item()) for t in lengths]
    width = max(sizes)
    buf = torch.zeros(width, dtype=torch.uint8)
    buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    outs = [torch.empty(width, dtype=torch.uint8, device=dev) for _ in range(size)]
    run(outs, buf.to(dev))
    got = []
    for t, k in zip(outs, sizes, strict=True):
        host = t.cpu().contiguous()
        got.append(ctypes.string_at(host.data_ptr(), k))
    return got


def _payload(prep: _Prepared | None, failure: BaseException | None, problems: Sequence[str]) -> bytes:
    """This rank's full summary, or what stopped it: never raises (every rank must send something)."""
    try:
        if problems:
            return pickle.dumps({"error": "; ".join(problems)})
        if failure is not None or prep is None:
            return pickle.dumps({"error": f"{type(failure).__name__}: {failure}"})
        return pickle.dumps(prep.mine.to_wire())
    except Exception as exc:  # noqa: BLE001 - an unpicklable error text still leaves a payload
        return pickle.dumps({"error": f"(could not encode this rank's summary: {type(exc).__name__})"})


def _decode(
    wires: Sequence[bytes], ranks: Sequence[int], records: Sequence[tuple[Any, ...]]
) -> tuple[tuple[RankSummary, ...], dict[int, str]]:
    """Every rank's summary (a stand-in from its record for a rank that sent an error) and the errors by rank."""
    summaries = []
    errors: dict[int, str] = {}
    for rank, wire, r in zip(ranks, wires, records, strict=True):
        try:
            doc = pickle.loads(wire)  # bytes from the job's own ranks, over its own process group
            if "error" in doc:
                raise LookupError(str(doc["error"]))
            summaries.append(RankSummary.from_wire(doc))
            continue
        except LookupError as exc:
            errors[rank] = str(exc.args[0])
        except Exception as exc:  # noqa: BLE001 - a summary another hwprofile wrote, that this one cannot read
            errors[rank] = f"its summary could not be read here ({type(exc).__name__}: {exc}); does it run another hwprofile?"
        summaries.append(
            RankSummary(
                rank=rank, host=_text(r[9]), local_rank=None if r[6] < 0 else r[6], device_index=r[5], device_name="(no profile)",
                device_sm="-", plugin="-", target="-", fingerprint=_text(r[8]) or "-", digest="", entries={},
            )
        )
    return tuple(summaries), errors


def _refusal(errors: dict[int, str], summaries: Sequence[RankSummary], records: Sequence[tuple[Any, ...]], ranks: Sequence[int]) -> str:
    """The message when a rank could not take part or the ranks passed different arguments."""
    n = len(ranks)
    hosts = {s.rank: s.host for s in summaries}
    lines = [f"hwprofile: check_agreement cannot compare the {n} ranks of the process group (every rank raises this error):"]
    for rank, text in errors.items():
        lines.append(f"  rank {rank} (host {hosts.get(rank, '?')}): {text}")
    fields: tuple[tuple[str, Callable[[tuple[Any, ...]], Any], Callable[[Any], str]], ...] = (
        ("mixed", lambda r: r[2], lambda v: repr(MIXED_CHOICES[v]) if v < len(MIXED_CHOICES) else "(invalid)"),
        ("gather", lambda r: r[3], lambda v: repr(bool(v))),
        ("timeout", lambda r: struct.pack("<d", r[4]), lambda v: _timeout_text(struct.unpack("<d", v)[0])),  # bytes: NaN == NaN
    )
    for name, pick, show in fields:
        by: dict[Any, list[int]] = {}
        for rank, r in zip(ranks, records, strict=True):
            by.setdefault(pick(r), []).append(rank)
        if len(by) > 1:
            held = "; ".join(f"{name}={show(v)} on {_who(rs)}" for v, rs in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1][0])))
            lines.append(f"  the ranks passed different arguments: {held}")
    lines.append(
        "  Fix: pass the same mixed=, timeout= and gather= on every rank, and make every rank able to resolve its profile "
        "(the quoted error says what failed there)."
    )
    return "\n".join(lines)


def _timeout_text(s: float) -> str:
    return "None" if math.isnan(s) else "float('inf')" if math.isinf(s) else f"{s:g}"


# --- the group and this rank's prepared record -------------------------------------------------------------


class _GroupInfo:
    """A process group's global ranks, this rank, whether it gathers CUDA tensors, a name for store keys, its timeout."""

    __slots__ = ("cuda", "me", "passed", "pg", "pg_s", "ranks", "tag")

    def __init__(self, pg: Any, passed: bool, ranks: tuple[int, ...], me: int, cuda: bool, tag: str, pg_s: float) -> None:
        # Weak references only: holding a process group here would keep it alive past destroy_process_group(), into
        # interpreter shutdown, where tearing gloo down aborts the process ("terminate called without an active exception").
        self.pg = weakref.ref(pg)
        self.passed = passed  # whether the caller named the group (else the collectives get group=None: the world)
        self.ranks, self.me, self.cuda, self.tag, self.pg_s = ranks, me, cuda, tag, pg_s

    def group(self) -> Any:
        """What to pass as the collectives' ``group=``."""
        return self.pg() if self.passed else None


_groups: dict[int, tuple[Any, _GroupInfo]] = {}


def _group_info(dist: Any, group: Any) -> _GroupInfo:
    """What :func:`check_agreement` needs of ``group``, cached per group object."""
    pg = group if group is not None else dist.group.WORLD
    hit = _groups.get(id(pg))
    if hit is not None and hit[0]() is pg:
        return hit[1]
    if dist.get_rank(pg) < 0:
        raise HwprofileError(
            f"check_agreement: rank {dist.get_rank()} is not a member of the group it was given; call it on the group's ranks only"
        )
    ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
    backend = str(dist.get_backend(pg)).lower()
    cuda = "nccl" in backend and "gloo" not in backend  # a combined "cpu:gloo,cuda:nccl" group gathers CPU tensors over gloo
    name = getattr(pg, "group_name", None) if group is not None else "world"
    tag = str(name or "ranks-" + "-".join(map(str, ranks)))
    info = _GroupInfo(pg, group is not None, ranks, int(dist.get_rank()), cuda, tag, _pg_seconds(pg, cuda))
    _groups[id(pg)] = (weakref.ref(pg), info)
    return info


def _pg_seconds(pg: Any, cuda: bool) -> float:
    """The group's own collective timeout in seconds (what ``timeout=None`` waits)."""
    import torch

    try:
        backend = pg._get_backend(torch.device("cuda" if cuda else "cpu"))
        return float(backend.options._timeout.total_seconds())
    except Exception:  # noqa: BLE001 - private API; the default is torch's documented one
        return _DEFAULT_PG_S


class _Prepared:
    """What repeated checks of one group and device reuse: this rank's summary, its record, the buffers."""

    __slots__ = ("cuda_index", "disabled", "group", "inp", "inp_key", "local_rank", "mine", "out", "prof", "raw", "record", "summaries")

    def __init__(self, group: Any, prof: Any, mine: RankSummary, record: tuple[Any, ...], out: Any, cuda_index: int | None) -> None:
        self.group = weakref.ref(group)  # the process group this was built for (a re-initialised world is another)
        self.prof = prof  # the profile object summarised (a reset() makes a new one)
        self.mine = mine
        self.local_rank = mine.local_rank
        self.disabled = mine.disabled
        self.record = record  # (device index, local rank, digest, fingerprint, host): the record's per-rank part
        self.inp: Any = None  # the packed record on the group's device, for inp_key's (status, mixed, gather, timeout)
        self.inp_key: tuple[Any, ...] = ()
        self.out = out  # the gather buffer
        self.cuda_index = cuda_index
        self.raw = b""  # the last gathered bytes that agreed, and their summaries
        self.summaries: tuple[RankSummary, ...] = ()


_prepared: dict[tuple[str, int], _Prepared] = {}


def _prepare(torch: Any, info: _GroupInfo, index: int, prof: Profile) -> _Prepared:
    """This rank's summary and record for ``prof``, built once per (group, device, profile, LOCAL_RANK, disable list)."""
    pg = info.pg()
    local_rank, disabled = _local_rank(), disabled_plugins()
    cuda_index = int(torch.cuda.current_device()) if info.cuda else None
    prep = _prepared.get((info.tag, index))
    same = prep is not None and prep.group() is pg and prep.prof is prof
    if prep is not None and same and (prep.local_rank, prep.disabled, prep.cuda_index) == (local_rank, disabled, cuda_index):
        return prep
    entries, digest = _local(prof)
    host = socket.gethostname()
    mine = RankSummary(
        rank=info.me,
        host=host,
        local_rank=local_rank,
        device_index=index,
        device_name=prof.device.name,
        device_sm=prof.device.sm,
        plugin=prof.plugin.label if prof.plugin else "none",
        target=prof.target or "-",
        fingerprint=prof.fingerprint,
        digest=digest.hex(),
        entries=entries,
        disabled=disabled,
    )
    # The fingerprint travels as text, for the table only: the verdict rests on the full SHA-256 digest, which covers it.
    record = (index, -1 if local_rank is None else local_rank, digest, prof.fingerprint.encode()[:16], host.encode()[:64])
    out = torch.empty(len(info.ranks) * RECORD_BYTES, dtype=torch.uint8, device=_device(torch, info))
    prep = _prepared[(info.tag, index)] = _Prepared(pg, prof, mine, record, out, cuda_index)
    return prep


def _device(torch: Any, info: _GroupInfo) -> Any:
    return torch.device("cuda", int(torch.cuda.current_device())) if info.cuda else torch.device("cpu")


def _buffers(
    torch: Any, info: _GroupInfo, prep: _Prepared | None, status: int, mixed: object, gather: object, wait_s: float | None
) -> tuple[Any, Any]:
    """This call's record (on the group's device) and the gather buffer; made before arriving, so nothing fails after."""
    code = _MIXED_CODE.get(mixed, _MIXED_INVALID) if isinstance(mixed, str) else _MIXED_INVALID
    args = (status, code, 1 if gather is True else 0, math.nan if wait_s is None else wait_s)
    if prep is not None and prep.inp_key == args:
        return prep.inp, prep.out
    if prep is not None:
        index, local, digest, fp, host = prep.record
    else:
        local_rank = _local_rank()
        index, local, digest, fp, host = -1, -1 if local_rank is None else local_rank, b"", b"", socket.gethostname().encode()[:64]
    record = _RECORD.pack(_PROTOCOL, *args, index, local, digest, fp, host)
    dev = _device(torch, info)
    inp = torch.frombuffer(bytearray(record), dtype=torch.uint8).to(dev)
    if prep is None:
        return inp, torch.empty(len(info.ranks) * RECORD_BYTES, dtype=torch.uint8, device=dev)
    prep.inp, prep.inp_key = inp, args
    return inp, prep.out


@_state.on_reset
def _forget_profiles() -> None:
    """After ``hwprofile.reset()``: drop this rank's summaries and gather buffers built for the old profiles.

    ``_calls`` stays: it numbers store keys, which must stay in step with the other ranks. (The
    entries and warn-once devices behind the summaries are ``_summary``'s to forget.)
    """
    _prepared.clear()
