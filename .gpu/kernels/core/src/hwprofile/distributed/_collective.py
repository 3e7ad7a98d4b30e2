"""The exchange over the engine's torch.distributed group: never a transport of its own, never torch at import.

:func:`check_agreement` runs the one collective through the group the engine already initialised
(gloo on the CPU, NCCL on the rank's current CUDA device); torch.distributed is imported inside the
functions that need it. The common case costs one ``all_gather`` of a fixed 128-byte record per
rank (a SHA-256 over every compared key, plus the rank's host, device index and fingerprint for the
table). Only when the digests differ (or with ``gather=True``) does every rank gather every rank's
full summary (a padded byte all_gather) to name the differing keys, values, provenance, ranks and hosts. Every rank takes
the same path, because every rank sees the same gathered digests; :func:`_missing_error` names the
ranks that never arrived when a wait times out or a peer dies.
"""

from __future__ import annotations

import ctypes
import pickle
import socket
import struct
import time
import weakref
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from .. import _state
from .._log import get_logger
from ..errors import AgreementError, HwprofileError
from ._compare import Agreement, _check_mixed, _message, _ranks, compare
from ._summary import RankSummary, _local, _local_rank, disabled_plugins, resolve_device

if TYPE_CHECKING:
    from ..profiles import Profile

log = get_logger("hwprofile.distributed")  # the package's logger, as before it was split into modules

_RECORD: Final = struct.Struct("<32s8sHh84s")  # digest, fingerprint, device index, local rank, host (utf-8, cut)
RECORD_BYTES: Final = _RECORD.size  # 128

_calls: dict[str, int] = {}  # checks per group in this process: numbers the store keys of a failed wait


def _seconds(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not s > 0:
        raise ValueError(
            f"check_agreement(timeout={timeout!r}): give a positive number of seconds, or None for the process group's timeout"
        )
    return s


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
    when everything that does not follow from the model agrees. ``timeout`` (seconds) bounds the wait
    for the other ranks (default: the process group's timeout); ``gather=True`` always gathers every
    rank's full summary (the bring-up command does). Every rank must pass the same ``mixed``,
    ``timeout`` and ``gather``.

    Returns an :class:`Agreement`; raises :class:`hwprofile.AgreementError` on every rank when the
    profiles differ, naming each differing key, its values, their provenance and the ranks and hosts
    holding each, or when a rank did not take part within ``timeout``.
    """
    _check_mixed(mixed)
    wait_s = _seconds(timeout)
    t0 = time.perf_counter()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise HwprofileError(f"check_agreement needs torch with torch.distributed ({exc})") from None
    if not dist.is_available() or not dist.is_initialized():
        raise HwprofileError(
            "check_agreement: torch.distributed is not initialised in this process; call torch.distributed.init_process_group() "
            "first (or run the bring-up check: torchrun --nproc-per-node N -m hwprofile.distributed)"
        )
    from ..profiles import profile

    pg, ranks, me, cuda, tag = _group_info(dist, group)
    index = resolve_device(device, cuda_backend=cuda)
    prep = _prepare(torch, pg, tag, len(ranks), index, profile(index), me, cuda)
    mine = prep.mine
    if len(ranks) == 1:
        return Agreement((mine,), {mine.model: (me,)}, mixed, gathered=True, seconds=time.perf_counter() - t0)

    seq = _calls[tag] = _calls.get(tag, 0) + 1
    gather_one = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    try:
        work = gather_one(prep.out, prep.inp, group=group, async_op=True)
        if wait_s is None:
            work.wait()
        else:
            work.wait(timedelta(seconds=wait_s))
        host_out = prep.out.cpu()  # NCCL: waits for the gather; gloo: the same tensor
        raw = ctypes.string_at(host_out.data_ptr(), host_out.numel())  # contiguous uint8; no numpy needed, no per-byte loop
    except Exception as exc:  # a timeout or a peer that died: say which ranks were missing
        raise _missing_error(dist, tag, seq, me, ranks, wait_s, exc) from exc

    if not gather and raw == prep.raw:  # the same answer as last time on this group: every rank agreed then
        return Agreement(prep.summaries, {mine.model: ranks}, mixed, gathered=False, seconds=time.perf_counter() - t0)
    records = [_RECORD.unpack_from(raw, i * RECORD_BYTES) for i in range(len(ranks))]
    if len({r[0] for r in records}) == 1 and not gather:
        prep.summaries = tuple(
            mine.replace(
                rank=rank,
                host=r[4].rstrip(b"\0").decode(errors="replace"),
                local_rank=None if r[3] < 0 else r[3],
                device_index=r[2],
                fingerprint=r[1].hex(),
            )
            for rank, r in zip(ranks, records, strict=True)
        )
        prep.raw = raw
        return Agreement(prep.summaries, {mine.model: ranks}, mixed, gathered=False, seconds=time.perf_counter() - t0)

    try:
        wires = _gather_bytes(torch, dist, group, pickle.dumps(mine.to_wire()), prep.inp.device, len(ranks))
    except Exception as exc:  # a peer that died between the two collectives
        raise _missing_error(dist, tag, seq, me, ranks, wait_s, exc) from exc
    summaries = tuple(RankSummary.from_wire(pickle.loads(w)) for w in wires)
    diffs, models = compare(summaries, mixed)
    if diffs:
        msg = _message(diffs, summaries, models, mixed)
        raise AgreementError(msg, differences=tuple(diffs), ranks=summaries)
    agreement = Agreement(summaries, models, mixed, gathered=True, seconds=time.perf_counter() - t0)
    if len(models) > 1 and me == ranks[0]:
        log.warning(
            "%s. Kernels and thresholds follow each model, so results differ between the models in the last bits; everything else agrees.",
            agreement.describe(),
        )
    return agreement


def _gather_bytes(torch: Any, dist: Any, group: Any, payload: bytes, dev: Any, size: int) -> list[bytes]:
    """Every rank's ``payload``, in group order: lengths, then one padded uint8 all_gather.

    Not ``all_gather_object``: torch's object collectives need numpy, which engines need not have
    (torch does not require it), and the bring-up command always takes this path.
    """
    n = torch.tensor([len(payload)], dtype=torch.int64, device=dev)
    lengths = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(size)]
    dist.all_gather(lengths, n, group=group)
    sizes = [int(t.item()) for t in lengths]
    width = max(sizes)
    buf = torch.zeros(width, dtype=torch.uint8)
    buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    outs = [torch.empty(width, dtype=torch.uint8, device=dev) for _ in range(size)]
    dist.all_gather(outs, buf.to(dev), group=group)
    got = []
    for t, k in zip(outs, sizes, strict=True):
        host = t.cpu().contiguous()
        got.append(ctypes.string_at(host.data_ptr(), k))
    return got


# Weak references only: holding a process group here would keep it alive past destroy_process_group(), into
# interpreter shutdown, where tearing gloo down aborts the process ("terminate called without an active exception").
_groups: dict[int, tuple[Any, tuple[int, ...], int, bool, str]] = {}


def _group_info(dist: Any, group: Any) -> tuple[Any, tuple[int, ...], int, bool, str]:
    """(the group, its global ranks, this rank, whether it gathers CUDA tensors, a name for store keys), cached per group object."""
    pg = group if group is not None else dist.group.WORLD
    hit = _groups.get(id(pg))
    if hit is not None and hit[0]() is pg:
        return pg, hit[1], hit[2], hit[3], hit[4]
    if dist.get_rank(pg) < 0:
        raise HwprofileError(
            f"check_agreement: rank {dist.get_rank()} is not a member of the group it was given; call it on the group's ranks only"
        )
    ranks = tuple(int(r) for r in dist.get_process_group_ranks(pg))
    backend = str(dist.get_backend(pg)).lower()
    cuda = "nccl" in backend and "gloo" not in backend  # a combined "cpu:gloo,cuda:nccl" group gathers CPU tensors over gloo
    name = getattr(pg, "group_name", None) if group is not None else "world"
    tag = str(name or "ranks-" + "-".join(map(str, ranks)))
    _groups[id(pg)] = (weakref.ref(pg), ranks, int(dist.get_rank()), cuda, tag)
    return pg, ranks, int(dist.get_rank()), cuda, tag


class _Prepared:
    """What repeated checks of one group and device reuse: this rank's summary, its record, the buffers."""

    __slots__ = ("cuda_index", "disabled", "group", "inp", "local_rank", "mine", "out", "prof", "raw", "summaries")

    def __init__(self, group: Any, prof: Any, mine: RankSummary, inp: Any, out: Any, cuda_index: int | None) -> None:
        self.group = weakref.ref(group)  # the process group this was built for (a re-initialised world is another)
        self.prof = prof  # the profile object summarised (a reset() makes a new one)
        self.mine = mine
        self.local_rank = mine.local_rank
        self.disabled = mine.disabled
        self.inp, self.out = inp, out  # the 128-byte record and the gather buffer, on the group's device
        self.cuda_index = cuda_index
        self.raw = b""  # the last gathered bytes that agreed, and their summaries
        self.summaries: tuple[RankSummary, ...] = ()


_prepared: dict[tuple[str, int], _Prepared] = {}


def _prepare(torch: Any, pg: Any, tag: str, size: int, index: int, prof: Profile, me: int, cuda: bool) -> _Prepared:
    """This rank's summary and record for ``prof``, built once per (group, device, profile, LOCAL_RANK, disable list)."""
    local_rank, disabled = _local_rank(), disabled_plugins()
    cuda_index = int(torch.cuda.current_device()) if cuda else None
    prep = _prepared.get((tag, index))
    same = prep is not None and prep.group() is pg and prep.prof is prof
    if prep is not None and same and (prep.local_rank, prep.disabled, prep.cuda_index) == (local_rank, disabled, cuda_index):
        return prep
    entries, digest = _local(prof)
    host = socket.gethostname()
    mine = RankSummary(
        rank=me,
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
    dev = torch.device("cuda", cuda_index) if cuda else torch.device("cpu")
    record = _RECORD.pack(
        digest, bytes.fromhex(prof.fingerprint[:16].ljust(16, "0")), index, -1 if local_rank is None else local_rank, host.encode()[:84]
    )
    inp = torch.frombuffer(bytearray(record), dtype=torch.uint8).to(dev)
    out = torch.empty(size * RECORD_BYTES, dtype=torch.uint8, device=dev)
    prep = _prepared[(tag, index)] = _Prepared(pg, prof, mine, inp, out, cuda_index)
    return prep


@_state.on_reset
def _forget_profiles() -> None:
    """After ``hwprofile.reset()``: drop this rank's summaries and gather buffers built for the old profiles.

    ``_calls`` stays: it numbers store keys, which must stay in step with the other ranks. (The
    entries and warn-once devices behind the summaries are ``_summary``'s to forget.)
    """
    _prepared.clear()


def _missing_error(
    dist: Any, tag: str, seq: int, me: int, ranks: Sequence[int], wait_s: float | None, exc: BaseException
) -> AgreementError:
    """After a failed wait: mark this rank as arrived in the group's store, give the others a moment, name who never came."""
    missing: list[int] = []
    arrived: list[int] = []
    try:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"hwprofile/agreement/{tag}/{seq}/"
        store.set(prefix + str(me), "1")
        grace = min(5.0, max(1.0, (wait_s or 10.0) / 2))
        deadline = time.monotonic() + grace
        others = [r for r in ranks if r != me]
        while True:
            missing = [r for r in others if not store.check([prefix + str(r)])]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        arrived = [r for r in ranks if r not in missing]
    except Exception as store_exc:  # noqa: BLE001 - naming the ranks is a courtesy; the failure is reported anyway
        log.info("hwprofile: could not ask the process group's store which ranks arrived: %s", store_exc)
    waited = f"{wait_s:g} s" if wait_s is not None else "the process group's timeout"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if missing:
        who = (
            f"rank{'s' * (len(missing) > 1)} {_ranks(missing)} had not called check_agreement when rank {me} gave up "
            f"(rank{'s' * (len(arrived) > 1)} {_ranks(arrived)} had)"
        )
    elif arrived:
        who = f"every rank reached check_agreement, but the collective failed on rank {me}"
    else:
        who = f"rank {me} cannot tell which of ranks {_ranks(ranks)} are missing (the process group's store did not answer)"
    msg = (
        f"hwprofile: check_agreement on rank {me} waited {waited} for the {len(ranks)} ranks of its group: {who}. "
        f"torch.distributed said: {first}. Every rank must call check_agreement after init_process_group and before the "
        "first forward; a rank that is still loading, crashed, or skipped the call would hang the job at its first collective. "
        "Raise timeout= if ranks legitimately arrive later."
    )
    return AgreementError(msg, missing=tuple(missing))
