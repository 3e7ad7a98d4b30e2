"""Which FP8 fallback ``fp8_mm`` takes, on the CPU: torch's scaled FP8 matmul (the split path) where the device has it
and the operands suit it, the dequantising path everywhere else, and the once-per-device probe that decides "has it".

The routing is checked with stand-in operands (only the attributes ``fp8_mm`` reads); the probe runs for real on
the CPU (torch's CPU ``_scaled_mm``) through a torch whose ``device("cuda", i)`` is the CPU, and with torches that lack
``_scaled_mm``, raise in it, or compute it wrong.
"""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile.ops import _fallbacks as F

torch = pytest.importorskip("torch")

BIG = (4096, 4096)  # 16 MiB of e4m3: past FP8_SPLIT_MIN_BYTES


class Device:
    def __init__(self, index: int) -> None:
        self.index = index


class Operand:
    """What fp8_mm reads of a tensor: shape, is_cuda, device.index, stride(), data_ptr()."""

    def __init__(self, shape: tuple[int, int], *, cuda: bool = True, strides: tuple[int, int] | None = None, ptr: int = 1 << 20,
                 index: int = 0) -> None:
        self.shape, self.is_cuda, self.device = shape, cuda, Device(index)
        self._strides = strides or (shape[1], 1)
        self._ptr = ptr

    def stride(self, dim: int) -> int:
        return self._strides[dim]

    def data_ptr(self) -> int:
        return self._ptr


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """fp8_mm's two paths and the probe replaced by recorders; the probe answers ``seen["ready"]`` and is remembered."""
    log: dict[str, Any] = {"calls": [], "probes": [], "ready": ("one", "factors"), "capturing": False, "compiling": False}
    monkeypatch.setattr(F, "_fp8_split", {})

    def probe(index: int) -> Any:
        log["probes"].append(index)
        F._fp8_split[index] = log["ready"]
        return log["ready"]

    monkeypatch.setattr(F, "_fp8_split_ready", probe)
    monkeypatch.setattr(F, "fp8_split_mm", lambda x, w, s, one, factors, fused=True: log["calls"].append(("split", one, factors, fused)))
    monkeypatch.setattr(F, "fp8_dequant_mm", lambda x, w, s: log["calls"].append(("dequant",)))
    monkeypatch.setattr(F, "_capturing", lambda: log["capturing"])
    monkeypatch.setattr(F, "_compiling", lambda: log["compiling"])
    return log


def call(x: Operand, w: Operand) -> None:
    F.fp8_mm(x, w, None)


def test_where_the_device_has_scaled_mm_the_split_path_runs_probed_once(seen: dict[str, Any]) -> None:
    x, w = Operand((1, BIG[1])), Operand(BIG)
    call(x, w)
    call(x, w)
    assert seen["calls"] == [("split", "one", "factors", True)] * 2
    assert seen["probes"] == [0]  # once per device
    call(Operand((1, BIG[1]), index=1), Operand(BIG, index=1))
    assert seen["probes"] == [0, 1]


def test_where_the_probe_fails_the_dequantising_path_runs(seen: dict[str, Any]) -> None:
    seen["ready"] = None
    call(Operand((1, BIG[1])), Operand(BIG))
    call(Operand((1, BIG[1])), Operand(BIG))
    assert seen["calls"] == [("dequant",)] * 2 and seen["probes"] == [0]


@pytest.mark.parametrize(("x", "w", "why"), [
    (Operand((1, 4096), cuda=False), Operand(BIG, cuda=False), "a CPU tensor"),
    (Operand((1, 1024)), Operand((1024, 1024)), "1 MiB of weight: the split's launches cost more than dequantising"),
    (Operand((1, 4096)), Operand((4104, 4096)), "N % 16"),
    (Operand((1, 4104)), Operand((4096, 4104)), "K % 16"),
    (Operand((1, 4096)), Operand(BIG, strides=(1, 4096)), "a column-major weight"),
    (Operand((1, 4096)), Operand(BIG, strides=(4104, 1)), "rows not 16-byte aligned"),
    (Operand((1, 4096)), Operand(BIG, ptr=(1 << 20) + 8), "a weight starting off a 16-byte boundary"),
])
def test_operands_the_split_cannot_take_dequantise_without_probing(seen: dict[str, Any], x: Operand, w: Operand, why: str) -> None:
    call(x, w)
    assert seen["calls"] == [("dequant",)], why
    assert seen["probes"] == [], why


def test_never_probed_inside_a_capture_or_a_trace_then_the_probe_outside_decides(seen: dict[str, Any]) -> None:
    x, w = Operand((1, BIG[1])), Operand(BIG)
    seen["capturing"] = True
    call(x, w)  # a first call in a capture: the dequantising path needs nothing new (no probe, no new constants)
    seen["capturing"], seen["compiling"] = False, True
    call(x, w)
    assert seen["calls"] == [("dequant",)] * 2 and seen["probes"] == []
    seen["compiling"] = False
    call(x, w)  # outside: probed, the split path
    seen["capturing"] = True
    call(x, w)  # inside a capture after the probe: the split path with the probe's constants
    seen["capturing"], seen["compiling"] = False, True
    call(x, w)  # traced: the plain (unfused) ops, which inductor fuses
    assert seen["calls"][2:] == [("split", "one", "factors", True)] * 2 + [("split", "one", "factors", False)]
    assert seen["probes"] == [0]


# --- the probe, run for real on the CPU ------------------------------------------------------------


class TorchOnCpu:
    """torch, but ``device("cuda", i)`` is the CPU, and any attribute overridden (``MISSING``: absent)."""

    MISSING = object()

    def __init__(self, **over: Any) -> None:
        self._over = {"device": lambda *a, **kw: torch.device("cpu"), **over}

    def __getattr__(self, name: str) -> Any:
        if name in self._over:
            v = self._over[name]
            if v is TorchOnCpu.MISSING:
                raise AttributeError(name)
            return v
        return getattr(torch, name)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "_fp8_split", {})


def probe_with(monkeypatch: pytest.MonkeyPatch, fake: TorchOnCpu) -> Any:
    monkeypatch.setattr(F, "_torch", fake)
    return F._fp8_split_ready(0)


@pytest.mark.usefixtures("fresh")
def test_the_probe_passes_where_scaled_mm_agrees_and_keeps_its_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    got = probe_with(monkeypatch, TorchOnCpu())
    assert got is not None
    one, factors = got
    assert float(one) == 1.0 and factors.flatten().tolist() == list(F.FP8_PART_SCALES)
    assert F._fp8_split[0] is got
    monkeypatch.setattr(F, "_torch", TorchOnCpu(_scaled_mm=TorchOnCpu.MISSING))
    assert F._fp8_split_ready(0) is got  # remembered: never probed again on that device


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize("broken", ["missing", "raises", "wrong"])
def test_the_probe_fails_without_scaled_mm_when_it_raises_or_when_it_disagrees(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    def raises(*a: Any, **kw: Any) -> Any:
        raise RuntimeError("no fp8 tensor cores on this device")

    def wrong(a: Any, b: Any, **kw: Any) -> Any:
        return torch._scaled_mm(a, b, **kw) * 1.01  # one percent off: more than a bf16 step

    fn = {"missing": TorchOnCpu.MISSING, "raises": raises, "wrong": wrong}[broken]
    with caplog.at_level("INFO", logger=F.log.name):
        assert probe_with(monkeypatch, TorchOnCpu(_scaled_mm=fn)) is None
    assert F._fp8_split == {0: None}
    if broken != "missing":
        assert "FP8 falls back by dequantising" in caplog.text


def test_the_probe_gives_the_split_path_the_dequantising_paths_numbers_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The constants a passing probe keeps run the split path to the dequantising path's numbers (within one bf16
    step) at a 16 MiB weight, on the CPU."""
    monkeypatch.setattr(F, "_fp8_split", {})
    monkeypatch.setattr(F, "_torch", TorchOnCpu())
    ready = F._fp8_split_ready(0)
    assert ready is not None
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, BIG[1], generator=g).bfloat16()
    w = (torch.randn(*BIG, generator=g) * 2).to(torch.float8_e4m3fn)
    s = torch.rand(BIG[0], generator=g) + 0.5
    a = F.fp8_split_mm(x, w, s, *ready).float()
    b = F.fp8_dequant_mm(x, w, s).float()
    assert bool(torch.allclose(a, b, rtol=2.0**-7, atol=0.0))
