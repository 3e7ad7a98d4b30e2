"""Cross-rank agreement over the engine's torch.distributed group; never torch at import, never a transport of its own.

Every rank of a group must have resolved the same profile, or the job stops with the ranks and keys
named, and every rank ends with the same verdict. Never imported by ``import hwprofile`` (nothing in
hwprofile imports this package); torch.distributed is imported inside the functions that need it.
The ranks meet in the group's store, then the collectives go through the group the engine already
initialised (gloo on the CPU, NCCL on the rank's current CUDA device).

    import torch.distributed as dist, hwprofile.distributed
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    agreement = hwprofile.distributed.check_agreement()   # every rank; raises AgreementError on a difference
    log.info("%s", agreement.table())

``torchrun --nproc-per-node N -m hwprofile.distributed`` is the bring-up command (see ``main``).

This module only names the public API; each name comes from the module that owns it:

* ``_summary``: what this rank resolved (:class:`Entry`, :class:`RankSummary`, :func:`profile_entries`,
  :func:`entries_digest`, :func:`disabled_plugins`) and the device it checks (:func:`resolve_device`);
* ``_compare``: comparing summaries (:func:`compare`, :class:`Difference`, :class:`Holding`) and the
  verdict (:class:`Agreement`, the ``AgreementError`` text);
* ``_collective``: :func:`check_agreement`, the exchange (the arrival in the group's store, where
  timeouts, late ranks and the ranks that never arrived are decided alike on every rank; the 128-byte
  record of ``RECORD_BYTES``; the details gather);
* ``_bringup``: the bring-up command (:func:`main`), which ``__main__`` runs.

Each is imported eagerly: together they load the standard library and hwprofile's own light modules only.
"""

from __future__ import annotations

from ._bringup import json_dumps, main
from ._collective import RECORD_BYTES, check_agreement
from ._compare import MIXED_CHOICES, Agreement, Difference, Holding, compare
from ._summary import Entry, RankSummary, disabled_plugins, entries_digest, profile_entries, resolve_device

__all__ = [
    "MIXED_CHOICES",
    "RECORD_BYTES",
    "Agreement",
    "Difference",
    "Entry",
    "Holding",
    "RankSummary",
    "check_agreement",
    "compare",
    "disabled_plugins",
    "entries_digest",
    "json_dumps",
    "main",
    "profile_entries",
    "resolve_device",
]
