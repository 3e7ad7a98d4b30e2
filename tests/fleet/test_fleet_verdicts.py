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
    assert len(k.launches) == 9 and _remote.counters()["verdict"]["rejected"] == 2  # read, then again under the lock
    data = store.client.get(keys[0])
    v = _verdicts.from_dict(json.loads(data)["verdict"])
    assert v is not None and v.ok and v.op == "gemv"


def test_a_host_waits_for_the_one_verifying_and_reads_its_verdict(
    seam: Seam, store: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path  # noqa: F811
) -> None:
    """Cold hosts at once: the one holding the instance's verify lock checks it; another waits on the lock, then reads the
    verdict it published instead of checking again (the compile and tune locks' semantics)."""
    import threading
    import time

    k = seam.kernel("gemv")
    x, w = torch.randn(1, 1024).to(torch.bfloat16), torch.randn(256, 1024).to(torch.bfloat16)
    _host(seam, monkeypatch, tmp_path / "host-a")
    ops.gemv(x, w)  # host a verifies and publishes: the verdict value another host would publish
    (key,) = [key.decode() for key in store.client.keys(f"{_remote.NAMESPACE}:verdict:*")]
    value = store.client.get(key)
    store.client.delete(key)
    lock_key = _remote.verify_lock_key(key)
    assert store.client.set(lock_key, b"another-host", nx=True, px=10_000)  # another host is checking it now

    def other_host_finishes() -> None:
        time.sleep(0.5)
        store.client.set(key, value)
        store.client.delete(lock_key)

    _host(seam, monkeypatch, tmp_path / "host-b")
    before = len(k.launches)
    threading.Thread(target=other_host_finishes).start()
    t0 = time.perf_counter()
    ops.gemv(x, w)
    assert time.perf_counter() - t0 >= 0.4  # it waited on the lock
    assert len(k.launches) == before + 1  # the call only: no check of its own
    assert not store.client.exists(lock_key)
