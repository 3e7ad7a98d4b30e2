"""Core's own plugin: the re-tuner and the self-test, reached from below through hooks; imports neither at load.

``profiles`` and ``ops`` sit below :mod:`hwprofile.retune` and :mod:`hwprofile.selftest` (both measure or run
kernels through ``hwprofile.ops``), so they must not import them, not even inside a function (that closes an
import circle: ``tests/package/test_import_graph.py``). They call the hooks :func:`~hwprofile.hookspecs.
hwprofile_first_profile` and :func:`~hwprofile.hookspecs.hwprofile_check_kernels` instead, and this module,
registered by the entry point ``hwprofile`` of core's distribution in the group ``hwprofile.plugins`` like
any plugin, answers them. It is loaded at every first ``profile()``: it imports only what is loaded by then
(the hook marker, the control variables), and the tool only when its variable asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import _env
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .profiles import Profile


@hookimpl
def hwprofile_first_profile(profile: Profile) -> Profile | None:
    """``HWPROFILE_TUNE=stale``: re-tune the device's stale thresholds (:func:`hwprofile.retune.at_first_profile`)."""
    if _env.TUNE.read(os.environ) != "stale":
        return None
    from . import retune

    return retune.at_first_profile(profile)


@hookimpl
def hwprofile_check_kernels(profile: Profile) -> Mapping[str, str] | None:
    """``HWPROFILE_SELFTEST=1``: self-test the device's kernels; the ops that failed (:func:`hwprofile.selftest.at_first_use`)."""
    if not _env.SELFTEST.read():
        return None
    from . import selftest

    return selftest.at_first_use(profile)
