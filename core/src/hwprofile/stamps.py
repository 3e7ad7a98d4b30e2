"""Kept so plugins written against hwprofile 0.1 keep importing ``hwprofile.stamps.Stamp``: use :mod:`hwprofile.tuning`."""

from __future__ import annotations

from .tuning import FALLBACK_FUNCTION, Stamp, changes, current, device_identity, fallback_identity

__all__ = ["FALLBACK_FUNCTION", "Stamp", "changes", "current", "device_identity", "fallback_identity"]
