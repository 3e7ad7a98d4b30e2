"""Fork safety on the CPU: ``profile()`` of a real GPU (a faked NVML H200) never initialises the CUDA driver.

CUDA's driver starts threads at ``cuInit`` and a forked child of such a process cannot use CUDA
("CUDA driver initialization failed"): vLLM's workers broke that way. The shipped tables' stamps
carry a launch-plan digest, and the plan of a real GPU depends on its SM count, which only the driver
gives; so the plan check waits for the first launch (:func:`hwprofile.tuning.check_deferred_plans`).
Here ``cuda.bindings.driver`` is a stand-in whose ``cuInit`` records each call (or raises), and the
test walks every path a first ``profile()`` takes: shipped stamps, a tuned file, ``show``-style
explain, the fingerprint.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import pytest

import hwprofile
from hwprofile import device
from tests.device.test_device import FakeNVML

H200 = [{"name": "NVIDIA H200", "cc": (9, 0), "uuid": "GPU-h200", "pci": "00000000:17:00.0", "cores": 16896}]


class RecordingDriver(types.ModuleType):
    """``cuda.bindings.driver`` with a ``cuInit`` that records its callers (or raises, ``refuse``)."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__("cuda.bindings.driver")
        self.inits: list[str] = []
        self.refuse = refuse

    def cuInit(self, flags: int) -> Any:
        import traceback

        self.inits.append("".join(traceback.format_stack(limit=12)))
        if self.refuse:
            raise AssertionError("cuInit called while a profile resolves")
        raise RuntimeError("no driver here")


@pytest.fixture
def real_h200(monkeypatch: pytest.MonkeyPatch, no_downstream: None) -> RecordingDriver:
    drv = RecordingDriver()
    cuda_pkg = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = drv  # type: ignore[attr-defined]
    cuda_pkg.bindings = bindings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", cuda_pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", drv)
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(H200))
    device._driver_attributes.cache_clear()
    hwprofile.reset()
    yield drv
    device._driver_attributes.cache_clear()
    hwprofile.reset()


def test_profile_of_a_real_h200_never_calls_cuinit(real_h200: RecordingDriver) -> None:
    before = {t.ident for t in threading.enumerate()}
    prof = hwprofile.profile(0)
    assert not prof.device.simulated and prof.plugin is not None and prof.plugin.name == "sm90"
    assert real_h200.inits == [], "profile() initialised the CUDA driver:\n" + "\n---\n".join(real_h200.inits)
    prof.fingerprint  # noqa: B018 - what logs quote and ranks compare
    for key in ("router_gemm.model", "gemv.model", "router_gemm.max_tokens"):
        prof.explain(key)
    assert real_h200.inits == []
    assert {t.ident for t in threading.enumerate()} <= before, "profile() left a thread running"


def test_stamps_of_a_real_gpu_say_the_plan_is_checked_at_the_first_launch(real_h200: RecordingDriver) -> None:
    from hwprofile import tuning

    prof = hwprofile.profile(0)
    w = prof.explain("router_gemm.model").winner
    assert isinstance(w.stamp, tuning.Stamp) and w.stamp.plan
    assert real_h200.inits == []
    assert not any("launch plan changed" in s for s in getattr(w, "stale", ()) or ())


class AttributeDriver(RecordingDriver):
    """A driver that starts (``cuInit`` recorded) and answers the SM count and shared memory of ``sms`` SMs."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38

    def __init__(self, sms: int) -> None:
        super().__init__()
        self.sms = sms

    def cuInit(self, flags: int) -> Any:
        self.inits.append("cuInit")
        return (0,)

    def cuDeviceGet(self, index: int) -> Any:
        return (0, index)

    def cuDeviceGetAttribute(self, attr: int, dev: int) -> Any:
        return (0, {16: self.sms, 97: 232448, 38: 60 << 20}[attr])


@pytest.mark.parametrize("sms, stale", [(132, False), (114, True)], ids=["h200-sms", "other-sms"])
def test_the_first_dispatch_table_compares_the_plans_profile_could_not(
    real_h200: RecordingDriver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sms: int, stale: bool
) -> None:
    """The shipped sm90 tables were measured on a 132-SM H200: the same plan there, another plan on a GPU of 114 SMs."""
    pytest.importorskip("torch")
    from hwprofile import ops

    drv = AttributeDriver(sms)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", drv)
    sys.modules["cuda.bindings"].driver = drv  # type: ignore[attr-defined]
    device._driver_attributes.cache_clear()
    hwprofile.reset()
    ops.reset_dispatch()
    prof = hwprofile.profile(0)
    assert drv.inits == []
    with caplog.at_level("WARNING", logger="hwprofile"):
        ops._dispatch.table(0)
    assert drv.inits == ["cuInit"]  # the first table: the driver starts, once
    warned = [r.getMessage() for r in caplog.records if "another launch plan" in r.getMessage()]
    assert bool(warned) is stale, warned
    if stale:
        assert "router_gemm.model" in warned[0] and "hwprofile tune --device 0" in warned[0]
        from hwprofile.errors import SettingError

        hwprofile.reset()
        strict = types.SimpleNamespace(prof=hwprofile.profile(0), index=0, strict=True)  # a first table under HWPROFILE_STRICT=1
        with pytest.raises(SettingError, match="another launch plan .*strict is on"):
            ops._verify.check_deferred_plans(strict)  # type: ignore[arg-type]
    del prof
