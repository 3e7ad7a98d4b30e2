"""Verification verdicts shared through the fleet store: a fleet verifies each kernel instance once.

Two "hosts" are two config directories (each its own verdict file) on one store: the first verifies and
publishes, the second reads the verdict and runs nothing; a verdict stamped for another kernel, or garbage
under the key, is not trusted (the instance is verified again, and the garbage counted as rejected).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hwprofile
from hwprofile import _remote, _verdicts, ops
from tests.trust.conftest import Seam, seam  # noqa: F401 - the fixture

from .conftest import Server

torch = pytest.importorskip("torch")


def _host(s: Seam, monkeypatch: pytest.MonkeyPatch, config: Path) -> None:
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(config))
    hwprofile.reset()
    ops.reset_dispatch()


def test_one_host_verifies_the_fleet_reuses(seam: Seam, store: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # noqa: F811
    k = seam.kernel("gemv")
    x, w = torch.randn(1, 1024).to(torch.bfloat16), torch.randn(256, 1024).to(torch.bfloat16)
    _host(seam, monkeypatch, tmp_path / "host-a")
    ops.gemv(x, w)
    assert len(k.launches) == 4 and _remote.counters()["verdict"]["publishes"] == 1
    keys = [key.decode() for key in store.client.keys(f"{_remote.NAMESPACE}:verdict:*")]
    assert len(keys) == 1
    _host(seam, monkeypatch, tmp_path / "host-b")
    ops.gemv(x, w)
    assert len(k.launches) == 5  # the call only: verified by host a
    assert _remote.counters()["verdict"]["hits"] == 1
    # garbage under the key is not trusted: checked again here, and replaced
    store.client.set(keys[0], b"not a verdict")
    _host(seam, monkeypatch, tmp_path / "host-c")
    ops.gemv(x, w)
    assert len(k.launches) == 9 and _remote.counters()["verdict"]["rejected"] == 1
    data = store.client.get(keys[0])
    v = _verdicts.from_dict(json.loads(data)["verdict"])
    assert v is not None and v.ok and v.op == "gemv"
