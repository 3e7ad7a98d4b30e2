"""The fused gate's ticket words (``ops._gate._counter``), on the CPU: which word each launch gets.

The kernel's last CTA is found by a ticket that returns to zero by itself (``hwprofile/moe_gate.cuh``: ``atom.inc``
modulo the CTA count), so a word is reusable by the next launch on its stream, but two launches that may run at once
must never share one: an eager launch takes its stream's word, every launch captured into a graph a word of its own
(graphs may be replayed on different streams at once). The words live in one per-device buffer allocated once, outside
any capture, never freed (a captured graph keeps its address). The GPU tests check the words are zero after launches.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hwprofile import ops
from hwprofile.ops import _gate

torch = pytest.importorskip("torch")


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Any:
    ops.register()
    monkeypatch.setattr(_gate, "_workspace", {})
    monkeypatch.setattr(_gate, "_stream_slot", {})
    monkeypatch.setattr(_gate, "_captured_next", {})
    return SimpleNamespace(index=0)


def word(t: Any, addr: int) -> int:
    base = int(_gate._workspace[t.index].data_ptr())
    assert (addr - base) % 4 == 0 and 0 <= addr - base < 4 * _gate.COUNTER_SLOTS
    return (addr - base) // 4


def test_eager_launches_share_their_streams_word_and_only_it(fresh: Any) -> None:
    dev = torch.device("cpu")
    a1, a2 = _gate._counter(fresh, dev, 111, False), _gate._counter(fresh, dev, 111, False)
    b = _gate._counter(fresh, dev, 222, False)
    assert a1 is not None and b is not None and a1 == a2 and a1 != b
    ws = _gate._workspace[0]
    assert ws.dtype == torch.int32 and ws.numel() == _gate.COUNTER_SLOTS and int(ws.count_nonzero()) == 0
    assert word(fresh, a1) < _gate._STREAM_SLOTS and word(fresh, b) < _gate._STREAM_SLOTS
    other: Any = SimpleNamespace(index=1)
    c = _gate._counter(other, dev, 111, False)
    assert c is not None and _gate._workspace[1] is not ws  # a device's own buffer


def test_every_captured_launch_gets_a_word_of_its_own(fresh: Any) -> None:
    dev = torch.device("cpu")
    eager = _gate._counter(fresh, dev, 111, False)  # the workspace exists before any capture
    assert eager is not None
    captured = [_gate._counter(fresh, dev, 111, True) for _ in range(5)]
    assert all(c is not None for c in captured)
    words = [word(fresh, c) for c in captured if c is not None]
    assert len(set(words)) == 5 and min(words) >= _gate._STREAM_SLOTS  # apart from every eager word and from each other
    ws = _gate._workspace[0]
    assert _gate._counter(fresh, dev, 222, False) is not None and _gate._workspace[0] is ws  # never reallocated


def test_inside_a_capture_no_workspace_is_allocated(fresh: Any) -> None:
    assert _gate._counter(fresh, torch.device("cpu"), 111, True) is None
    assert _gate._workspace == {}


def test_captured_words_wrap_with_a_warning(fresh: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    dev = torch.device("cpu")
    _gate._counter(fresh, dev, 111, False)
    monkeypatch.setitem(_gate._captured_next, 0, _gate.COUNTER_SLOTS - 2)
    with caplog.at_level("WARNING", logger=_gate.log.name):
        last = [_gate._counter(fresh, dev, 111, True) for _ in range(3)]
    assert [word(fresh, c) for c in last if c is not None] == [_gate.COUNTER_SLOTS - 2, _gate.COUNTER_SLOTS - 1, _gate._STREAM_SLOTS]
    assert "reused" in caplog.text
