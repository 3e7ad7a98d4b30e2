"""Device detection: which GPUs this process sees, in CUDA's numbering, without creating a CUDA context.

Detection reads NVML only (no ``cuInit``, no torch), so a process can detect and then fork workers.
Driver attributes that only CUDA knows (SM count, opt-in shared memory, L2 size) are read through
cuda-python on demand, by :meth:`DeviceInfo.attributes`, and their absence is not an error.
Simulated devices (``HWPROFILE_DEVICE``) come from :mod:`hwprofile.catalog`; entries that plugins
contribute are passed in by the caller (``plugin_catalog``), so detection never imports the
registry or the profiles (``hwprofile.detect`` is :func:`hwprofile.profiles.detect`, which passes them).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from . import _env, _state
from ._log import get_logger
from ._record import Record, final
from .errors import DeviceError

if TYPE_CHECKING:
    from .catalog import CatalogEntry

    #: What a caller passes to reach the plugins' catalog entries (``Registry.catalog_entries``); called only when needed.
    PluginCatalog = Callable[[], Mapping[str, CatalogEntry]]

log = get_logger(__name__)
_T = TypeVar("_T")


@final
class DriverAttributes(Record):
    """Facts read from the CUDA driver (or the catalog, for a simulated device); ``None`` if unknown."""

    sm_count: int | None = None
    #: Shared memory one block can opt in to, in bytes.
    max_shared_memory_per_block_optin: int | None = None
    l2_cache_bytes: int | None = None


@final
class DeviceInfo(Record):
    """One visible GPU, numbered as CUDA (and torch) number it in this process; may be simulated.

    Facts NVML did not report (or a simulated device's catalog entry lacks) are ``None``.
    """

    #: CUDA's index of the device in this process (after ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``).
    index: int
    #: NVML's product name, ``"NVIDIA H200"``.
    name: str
    #: Exact ``(major, minor)``; plugins match it exactly, never the major alone.
    compute_capability: tuple[int, int]
    #: ``True`` for a device from ``HWPROFILE_DEVICE`` (no GPU behind it).
    simulated: bool = False
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_bytes: int | None = None
    #: Read only when ordering several GPUs needs them, or by :func:`with_details`.
    max_sm_clock_mhz: int | None = None
    max_memory_clock_mhz: int | None = None
    memory_bus_width_bits: int | None = None
    driver_version: str | None = None
    #: The CUDA version the driver supports, ``(13, 0)``.
    cuda_driver_version: tuple[int, int] | None = None
    #: The catalog entry a simulated device came from.
    catalog_key: str | None = None
    #: A simulated device's driver attributes, from its catalog entry (what :meth:`attributes` returns
    #: for it); ``None`` for a real GPU, whose attributes are read from the driver.
    catalog_attributes: DriverAttributes | None = None

    @property
    def sm(self) -> str:
        """``"sm_90"``-style name of the exact compute capability."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def attributes(self) -> DriverAttributes:
        """SM count, opt-in shared memory per block and L2 size: a simulated device's from its catalog
        entry, a real GPU's read lazily from the driver (may initialise CUDA)."""
        if self.catalog_attributes is not None:
            return self.catalog_attributes
        return _driver_attributes(self.index)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready facts (no lazily-read driver attributes)."""
        return {
            "index": self.index,
            "name": self.name,
            "compute_capability": list(self.compute_capability),
            "sm": self.sm,
            "simulated": self.simulated,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "memory_bytes": self.memory_bytes,
            "max_sm_clock_mhz": self.max_sm_clock_mhz,
            "max_memory_clock_mhz": self.max_memory_clock_mhz,
            "memory_bus_width_bits": self.memory_bus_width_bits,
            "driver_version": self.driver_version,
            "cuda_driver_version": list(self.cuda_driver_version) if self.cuda_driver_version else None,
        }


@final
class Detection(Record):
    """The devices this process sees; when there are none, ``reason`` says why."""

    #: In CUDA's numbering: ``devices[i].index == i``.
    devices: tuple[DeviceInfo, ...]
    #: Why there is no device (NVML missing, no driver, ``CUDA_VISIBLE_DEVICES`` hides all); ``None`` otherwise.
    reason: str | None = None
    simulated: bool = False

    def device(self, index: int) -> DeviceInfo:
        """Device ``index`` in CUDA numbering, or an error that says what is visible."""
        if not self.devices:
            raise DeviceError(f"no NVIDIA GPU: {self.reason}. Simulate one with {_env.DEVICE.name}=<name>, e.g. h200.")
        if not 0 <= index < len(self.devices):
            raise DeviceError(
                f"device {index} does not exist: {len(self.devices)} device(s) visible "
                f"({', '.join(d.name for d in self.devices)}); use an index from 0 to {len(self.devices) - 1}"
            )
        return self.devices[index]


#: What decides a detection: the simulated names (empty: the real GPUs), CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER.
_Key = tuple[tuple[str, ...], str | None, str | None]
_detections: dict[_Key, Detection] = {}


def _key(environ: Mapping[str, str] | None) -> _Key:
    env = os.environ if environ is None else environ
    return _env.DEVICE.read(env), env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER")


def detect(environ: Mapping[str, str] | None = None, plugin_catalog: PluginCatalog | None = None) -> Detection:
    """Detect the visible devices (cached per relevant environment), honouring the simulation variable.

    ``plugin_catalog`` returns the plugins' catalog entries, for a simulated name that is neither
    built in nor a capability (without it such a name is unknown): :func:`hwprofile.profiles.detect`
    passes the process registry's.
    """
    key = _key(environ)
    found = _detections.get(key)
    if found is None:
        found = _detections[key] = _detect(*key, plugin_catalog=plugin_catalog)
    return found


def _detect(
    simulate: tuple[str, ...], visible: str | None, order: str | None, publish: Callable[[Detection], None] | None = None,
    plugin_catalog: PluginCatalog | None = None,
) -> Detection:
    """Detect for one environment key; ``publish`` gets the result before NVML's teardown."""
    if simulate:
        return _simulate(simulate, plugin_catalog)

    def finish(raw: list[_Raw], reason: str | None) -> Detection:
        if not raw:
            return Detection((), reason)
        ordered = order_devices(raw, order)
        chosen = apply_visible_devices(ordered, visible)
        devices = tuple(_renumber(d, i) for i, d in enumerate(chosen))
        if not devices:
            return Detection((), f"CUDA_VISIBLE_DEVICES={visible!r} hides all {len(raw)} GPU(s)")
        return Detection(devices)

    early: list[Detection] = []

    def on_read(raw: list[_Raw]) -> None:
        early.append(finish(raw, None))
        assert publish is not None
        publish(early[0])

    raw, reason = _probe_nvml(on_read if publish is not None else None)
    return early[0] if early else finish(raw, reason)


@_state.on_reset
def clear_cache() -> None:
    """Forget detected devices (tests, or after changing the environment)."""
    _detections.clear()
    _driver_attributes.cache_clear()


def simulated_detection(spec: str, plugin_catalog: PluginCatalog | None = None) -> Detection:
    """Devices from a comma list of catalog names, as ``HWPROFILE_DEVICE`` reads it: ``"gb300,rtx-pro-6000"``
    is devices 0 and 1. ``plugin_catalog`` as for :func:`detect`."""
    names = _env.DEVICE.parse(spec)
    if not names:
        raise _env.DEVICE.refused(spec)
    return _simulate(names, plugin_catalog)


def _simulate(names: tuple[str, ...], plugin_catalog: PluginCatalog | None) -> Detection:
    from . import catalog  # only simulation needs it here

    devices = []
    for i, name in enumerate(names):
        e = catalog.lookup(name, plugin_entries=plugin_catalog)
        devices.append(
            DeviceInfo(
                index=i,
                name=e.name,
                compute_capability=e.compute_capability,
                simulated=True,
                memory_bytes=e.memory_bytes,
                max_sm_clock_mhz=e.max_sm_clock_mhz,
                max_memory_clock_mhz=e.max_memory_clock_mhz,
                memory_bus_width_bits=e.memory_bus_width_bits,
                catalog_key=name.strip().lower(),
                catalog_attributes=DriverAttributes(e.sm_count, e.max_shared_memory_per_block_optin, e.l2_cache_bytes),
            )
        )
    return Detection(tuple(devices), simulated=True)


def _renumber(d: DeviceInfo, index: int) -> DeviceInfo:
    return d.replace(index=index)


# --- ordering: make device i mean what CUDA device i means ----------------------------------------


@final
class _Raw(Record):
    info: DeviceInfo
    cores: int | None  # CUDA cores, a proxy CUDA's FASTEST_FIRST order can be estimated from


def order_devices(raw: list[_Raw], order: str | None) -> list[DeviceInfo]:
    """Order NVML's devices (PCI bus order) the way CUDA numbers them.

    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is exact. CUDA's default ``FASTEST_FIRST`` is estimated as
    capability, then cores x clock, descending, with ties kept in PCI order; on hosts with mixed GPUs
    set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` to remove the guess.
    """
    if (order or "FASTEST_FIRST").upper() == "PCI_BUS_ID":
        return [r.info for r in raw]
    if order and order.upper() != "FASTEST_FIRST":
        log.warning("CUDA_DEVICE_ORDER=%r is not PCI_BUS_ID or FASTEST_FIRST; CUDA treats it as FASTEST_FIRST", order)

    def speed(r: _Raw) -> tuple[int, int, int]:
        cc = r.info.compute_capability
        return (-cc[0], -cc[1], -((r.cores or 0) * (r.info.max_sm_clock_mhz or 0)))

    return [r.info for r in sorted(raw, key=speed)]


def apply_visible_devices(ordered: list[DeviceInfo], visible: str | None) -> list[DeviceInfo]:
    """Apply ``CUDA_VISIBLE_DEVICES`` as CUDA does: indices or UUID prefixes, stop at the first invalid entry."""
    if visible is None:
        return list(ordered)
    chosen: list[DeviceInfo] = []
    for token in (t.strip() for t in visible.split(",")):
        match: DeviceInfo | None = None
        if token.lstrip("-").isdigit():
            i = int(token)
            match = ordered[i] if 0 <= i < len(ordered) else None
        elif token.upper().startswith(("GPU-", "MIG-")):
            hits = [d for d in ordered if d.uuid and d.uuid.lower().startswith(token.lower())]
            match = hits[0] if len(hits) == 1 else None
        if match is None or match in chosen:
            if token:
                log.debug("CUDA_VISIBLE_DEVICES: entry %r is invalid; CUDA ignores it and every later entry", token)
            break
        chosen.append(match)
    return chosen


# --- NVML -------------------------------------------------------------------------------------------


def _probe_nvml(on_read: Callable[[list[_Raw]], None] | None = None) -> tuple[list[_Raw], str | None]:
    """Read every GPU through NVML: ``([], reason)`` when there is none. NVML errors are reasons,
    never exceptions. ``on_read`` gets the devices before ``nvmlShutdown`` (about 3 ms)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML could not start ({_nvml_reason(exc)}); no NVIDIA driver is usable on this machine"
    except OSError as exc:  # pragma: no cover - odd loader failures
        return [], f"NVML library could not be loaded ({exc})"
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return [], "the NVIDIA driver reports no GPU"
        driver = _q(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        cuda_v = _q(pynvml.nvmlSystemGetCudaDriverVersion)
        cuda_driver = (cuda_v // 1000, (cuda_v % 1000) // 10) if isinstance(cuda_v, int) else None
        raw = []
        several = count > 1  # max clocks 1.4-3.8 ms a query, bus width 0.2-0.5 (RESULTS.md): read them and cores only to order GPUs
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            info = DeviceInfo(
                index=i,
                name=_text(pynvml.nvmlDeviceGetName(h)),
                compute_capability=(int(major), int(minor)),
                uuid=_q(lambda h: _text(pynvml.nvmlDeviceGetUUID(h)), h),
                pci_bus_id=_q(lambda h: _text(pynvml.nvmlDeviceGetPciInfo(h).busId), h),
                memory_bytes=_q(lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).total, h),
                driver_version=driver,
                cuda_driver_version=cuda_driver,
            )
            if several:
                info = info.replace(**_slow_facts(pynvml, h))
            raw.append(_Raw(info, _q(lambda h: pynvml.nvmlDeviceGetNumGpuCores(h), h) if several else None))
        if on_read is not None:
            on_read(raw)
        return raw, None
    except pynvml.NVMLError as exc:
        return [], f"NVML failed while listing GPUs ({_nvml_reason(exc)})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:  # pragma: no cover
            pass


def _slow_facts(pynvml: Any, h: Any) -> dict[str, int | None]:
    """Max clocks and memory bus width: slow NVML queries (milliseconds each on some drivers)."""
    return {
        "max_sm_clock_mhz": _q(lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
        "max_memory_clock_mhz": _q(lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
        "memory_bus_width_bits": _q(lambda: pynvml.nvmlDeviceGetMemoryBusWidth(h)),
    }


def with_details(d: DeviceInfo) -> DeviceInfo:
    """``d`` with max clocks and bus width filled in (a second, short NVML session for a real GPU)."""
    if d.simulated or d.max_sm_clock_mhz is not None or d.uuid is None:
        return d
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - details are optional
        return d
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(d.uuid)
        return d.replace(**_slow_facts(pynvml, h))
    except Exception:  # noqa: BLE001
        return d
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001  # pragma: no cover
            pass


def _q(fn: Callable[..., _T], *args: object) -> _T | None:
    """One optional NVML query: ``None`` when the device or driver does not support it."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises many NotSupported subclasses; all mean "unknown"
        return None


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _nvml_reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


@functools.cache
def _driver_attributes(index: int) -> DriverAttributes:
    """Read driver attributes through cuda-python; initialises the driver API (not a context)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        log.info("cuda-python is not installed; driver attributes of device %d are unknown", index)
        return DriverAttributes()
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return DriverAttributes()
        err, dev = cu.cuDeviceGet(index)
        if err != cu.CUresult.CUDA_SUCCESS:
            return DriverAttributes()
        A = cu.CUdevice_attribute

        def attr(a: object) -> int | None:
            e, v = cu.cuDeviceGetAttribute(a, dev)
            return int(v) if e == cu.CUresult.CUDA_SUCCESS else None

        return DriverAttributes(
            sm_count=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            max_shared_memory_per_block_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            l2_cache_bytes=attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        )
    except Exception as exc:  # noqa: BLE001 - absence of attributes is not an error
        log.info("could not read driver attributes of device %d: %s", index, exc)
        return DriverAttributes()
