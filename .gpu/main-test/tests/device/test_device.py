"""Detection: simulation catalog, CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER, and 'no GPU' results."""

from __future__ import annotations

import pytest

from hwprofile import _first_profile, device
from hwprofile.catalog import CATALOG, lookup
from hwprofile.device import DeviceInfo, _Raw, apply_visible_devices, order_devices
from hwprofile.errors import DeviceError

REQUIRED = [
    "h100", "h200", "b200", "b300", "gb300", "rtx-pro-6000", "rtx-5090", "dgx-spark", "l40s", "a100",
    "sm90", "sm100", "sm103", "sm120", "sm121",
]


@pytest.mark.parametrize("name", REQUIRED)
def test_catalog_has_required_devices(name: str) -> None:
    e = lookup(name)
    assert e.sm_count > 0 and e.memory_bytes > 0


def test_exact_capabilities_of_catalog() -> None:
    assert lookup("dgx-spark").compute_capability == (12, 1)
    assert lookup("gb300").compute_capability == (10, 3)
    assert lookup("l40s").compute_capability == (8, 9)
    assert lookup("SM_121").compute_capability == (12, 1)
    assert lookup("rtx-pro-6000").max_shared_memory_per_block_optin == 99 * 1024


def test_unknown_simulated_name_lists_known_ones() -> None:
    with pytest.raises(DeviceError) as e:
        device.detect({"HWPROFILE_DEVICE": "h300"})
    assert "h300" in str(e.value) and "rtx-pro-6000" in str(e.value)


def test_comma_list_simulates_mixed_host() -> None:
    det = device.detect({"HWPROFILE_DEVICE": "gb300, rtx-pro-6000"})
    assert [d.compute_capability for d in det.devices] == [(10, 3), (12, 0)]
    assert [d.index for d in det.devices] == [0, 1]
    assert all(d.simulated for d in det.devices)
    assert det.devices[1].attributes().max_shared_memory_per_block_optin == 99 * 1024
    with pytest.raises(DeviceError, match="device 2 does not exist"):
        det.device(2)


def test_no_gpu_is_a_clean_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_probe_nvml", lambda on_read=None: ([], "NVML could not start (Driver Not Loaded)"))
    device.clear_cache()
    det = device.detect({})
    assert det.devices == () and "NVML" in (det.reason or "")
    with pytest.raises(DeviceError, match="no NVIDIA GPU"):
        det.device(0)


def test_real_probe_never_raises_here() -> None:
    raw, reason = device._probe_nvml()
    assert raw or reason


def _raw(i: int, cc: tuple[int, int], uuid: str, cores: int, clock: int = 2000) -> _Raw:
    return _Raw(DeviceInfo(i, f"gpu{i}", cc, uuid=uuid, max_sm_clock_mhz=clock), cores)


MIXED = [_raw(0, (12, 0), "GPU-aaaa-1111", 8960), _raw(1, (10, 0), "GPU-bbbb-2222", 18944)]


def test_pci_bus_order_is_nvml_order() -> None:
    assert [d.name for d in order_devices(MIXED, "PCI_BUS_ID")] == ["gpu0", "gpu1"]


def test_fastest_first_puts_newest_capability_first_and_keeps_ties() -> None:
    assert [d.name for d in order_devices(MIXED, None)] == ["gpu0", "gpu1"]  # 12.0 > 10.0
    same = [_raw(0, (9, 0), "GPU-1", 16896), _raw(1, (9, 0), "GPU-2", 16896)]
    assert [d.name for d in order_devices(same, "FASTEST_FIRST")] == ["gpu0", "gpu1"]


def test_visible_devices_indices_uuids_and_stop_at_invalid() -> None:
    ordered = order_devices(MIXED, "PCI_BUS_ID")
    assert [d.name for d in apply_visible_devices(ordered, "1")] == ["gpu1"]
    assert [d.name for d in apply_visible_devices(ordered, "1,0")] == ["gpu1", "gpu0"]
    assert [d.name for d in apply_visible_devices(ordered, "GPU-bbbb")] == ["gpu1"]
    assert [d.name for d in apply_visible_devices(ordered, "0,7,1")] == ["gpu0"]  # CUDA stops at the invalid 7
    assert apply_visible_devices(ordered, "") == []
    assert apply_visible_devices(ordered, "-1") == []
    assert [d.name for d in apply_visible_devices(ordered, "0,0")] == ["gpu0"]


def test_visible_devices_renumber(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_probe_nvml", lambda on_read=None: (MIXED, None))
    device.clear_cache()
    det = device.detect({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [(d.index, d.name) for d in det.devices] == [(0, "gpu1")]
    det = device.detect({"CUDA_VISIBLE_DEVICES": "5"})
    assert det.devices == () and "hides all" in (det.reason or "")


def test_catalog_generic_entries_match_their_names() -> None:
    for key, cc in {"sm90": (9, 0), "sm100": (10, 0), "sm103": (10, 3), "sm120": (12, 0), "sm121": (12, 1)}.items():
        assert CATALOG[key].compute_capability == cc


class FakeNVML:
    """A stand-in for pynvml with two GPUs, so the NVML code path runs in CPU-only CI."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[dict], fail_init: bool = False) -> None:
        self.gpus, self.fail_init, self.calls = gpus, fail_init, []

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict:
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, u: str) -> dict:
        return next(g for g in self.gpus if g["uuid"] == u)

    def nvmlDeviceGetName(self, h: dict) -> bytes:
        return h["name"].encode()

    def nvmlDeviceGetCudaComputeCapability(self, h: dict) -> tuple[int, int]:
        return h["cc"]

    def nvmlDeviceGetUUID(self, h: dict) -> str:
        return h["uuid"]

    def nvmlDeviceGetPciInfo(self, h: dict) -> object:
        return type("Pci", (), {"busId": h["pci"]})()

    def nvmlDeviceGetMemoryInfo(self, h: dict) -> object:
        return type("Mem", (), {"total": 80 << 30})()

    def nvmlDeviceGetMaxClockInfo(self, h: dict, which: int) -> int:
        self.calls.append("clock")
        return 1980 if which == 1 else 2619

    def nvmlDeviceGetMemoryBusWidth(self, h: dict) -> int:
        raise self.NVMLError("Not Supported")  # optional facts may be missing

    def nvmlDeviceGetNumGpuCores(self, h: dict) -> int:
        return h["cores"]

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000


GPUS = [
    {"name": "NVIDIA RTX PRO 4000", "cc": (12, 0), "uuid": "GPU-aaaa", "pci": "00000000:17:00.0", "cores": 8960},
    {"name": "NVIDIA GB300", "cc": (10, 3), "uuid": "GPU-bbbb", "pci": "00000000:65:00.0", "cores": 20480},
]


def test_nvml_probe_two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    fake = FakeNVML(GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    device.clear_cache()
    det = device.detect({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [d.name for d in det.devices] == ["NVIDIA RTX PRO 4000", "NVIDIA GB300"]
    d = det.devices[1]
    assert d.compute_capability == (10, 3) and d.uuid == "GPU-bbbb" and d.pci_bus_id == "00000000:65:00.0"
    assert d.driver_version == "580.159.04" and d.cuda_driver_version == (13, 0)
    assert d.max_sm_clock_mhz == 1980 and d.memory_bus_width_bits is None  # unsupported query: None, not an error
    assert fake.calls[-1] == "shutdown"
    det = device.detect({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"})
    assert [(x.index, x.name) for x in det.devices] == [(0, "NVIDIA GB300")]


def test_nvml_probe_one_gpu_skips_slow_queries_until_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    fake = FakeNVML(GPUS[:1])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    device.clear_cache()
    d = device.detect({}).devices[0]
    assert "clock" not in fake.calls and d.max_sm_clock_mhz is None
    full = device.with_details(d)
    assert full.max_sm_clock_mhz == 1980 and full.max_memory_clock_mhz == 2619


def test_nvml_init_failure_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(GPUS, fail_init=True))
    device.clear_cache()
    det = device.detect({})
    assert det.devices == () and "Driver Not Loaded" in (det.reason or "")


class ThreadRecordingNVML(FakeNVML):
    """FakeNVML that records which thread starts NVML (a real probe would sit in the driver there)."""

    def __init__(self, gpus: list[dict], **kw: object) -> None:
        super().__init__(gpus, **kw)  # type: ignore[arg-type]
        self.init_threads: list[str] = []

    def nvmlInit(self) -> None:
        import threading

        self.init_threads.append(threading.current_thread().name)
        super().nvmlInit()


def _real_gpu_env(monkeypatch: pytest.MonkeyPatch, fake: FakeNVML) -> None:
    import sys

    import hwprofile

    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    hwprofile.reset()


def _probe_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "hwprofile-nvml-probe"]


def test_first_profile_starts_nvml_beside_plugin_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    import hwprofile

    fake = ThreadRecordingNVML(GPUS[:1])  # RTX PRO 4000, sm_120
    _real_gpu_env(monkeypatch, fake)
    p = hwprofile.profile(0)
    assert p.device.name == "NVIDIA RTX PRO 4000" and p.plugin is not None and p.plugin.name == "sm120"
    assert fake.init_threads == ["hwprofile-nvml-probe"] and fake.calls[-1] == "shutdown"
    assert _probe_threads() == [], "the probe thread must be joined before profile() returns"
    hwprofile.profile(0)
    assert hwprofile.detect().devices[0].uuid == "GPU-aaaa" and fake.init_threads == ["hwprofile-nvml-probe"]  # cached


def test_first_profile_reports_missing_gpu_before_a_broken_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    import hwprofile
    from hwprofile import registry
    from hwprofile.errors import PluginError

    def broken(self: object) -> object:
        raise PluginError("plugin 'x' failed to import")

    _real_gpu_env(monkeypatch, ThreadRecordingNVML(GPUS, fail_init=True))
    monkeypatch.setattr(registry.Registry, "load_entry_points", broken)
    with pytest.raises(DeviceError, match="Driver Not Loaded"):
        hwprofile.profile(0)
    _real_gpu_env(monkeypatch, ThreadRecordingNVML(GPUS))
    with pytest.raises(PluginError, match="failed to import"):
        hwprofile.profile(0)
    assert _probe_threads() == []


def test_error_inside_the_probe_thread_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    import hwprofile

    class Exploding(ThreadRecordingNVML):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("driver returned garbage")

    _real_gpu_env(monkeypatch, Exploding(GPUS))
    with pytest.raises(RuntimeError, match="driver returned garbage"):
        hwprofile.profile(0)
    assert _probe_threads() == []


def test_simulated_or_cached_detection_starts_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    pending = _first_profile.detect_in_background()
    assert _probe_threads() == [] and pending.result().devices[0].name == "NVIDIA H200"
    pending.close()
    fake = ThreadRecordingNVML(GPUS)
    _real_gpu_env(monkeypatch, fake)
    device.detect()
    _first_profile.detect_in_background().result()
    assert fake.init_threads == ["MainThread"]


def test_devices_are_ready_before_nvml_shuts_down(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import threading

    class SlowShutdown(ThreadRecordingNVML):
        def __init__(self, gpus: list[dict], fail: bool = False) -> None:
            super().__init__(gpus)
            self.release, self.fail = threading.Event(), fail

        def nvmlShutdown(self) -> None:
            assert self.release.wait(10)
            super().nvmlShutdown()
            if self.fail:
                raise RuntimeError("teardown went wrong")

    fake = SlowShutdown(GPUS[:1])
    _real_gpu_env(monkeypatch, fake)
    pending = _first_profile.detect_in_background()
    assert pending.result().devices[0].uuid == "GPU-aaaa" and "shutdown" not in fake.calls  # the teardown still waits
    fake.release.set()
    pending.close()
    assert fake.calls == ["shutdown"] and _probe_threads() == [] and device.detect().devices[0].uuid == "GPU-aaaa"

    failing = SlowShutdown(GPUS[:1], fail=True)
    _real_gpu_env(monkeypatch, failing)
    failing.release.set()
    pending = _first_profile.detect_in_background()
    assert pending.result().devices[0].name == "NVIDIA RTX PRO 4000"
    with caplog.at_level("WARNING", logger="hwprofile.device"):
        pending.close()
    assert "teardown went wrong" in caplog.text
