"""Start-up trick: the first ``profile()`` of a process overlaps NVML's start-up and teardown.

Never starts a thread that outlives the call that started it: a process may fork right after.

Why: NVML's start-up spends most of its 15-20 ms inside the driver with the GIL released
(``nvmlInit``, the first device handle, ``nvmlShutdown``). The plugins (entry points, imports,
registration) do not depend on the device, so the calling thread loads them meanwhile, and resolves
the profile while NVML shuts down. A first ``profile()`` then costs little more than NVML's own start:
+11.3 ms over NVML on the H200, against +19.9 ms with detection first (benchmarks/RESULTS.md,
"Start-up"). Equivalence: ``tests/profiles/test_first_profile.py`` checks that the overlapped path gives the
profile the sequential path (:func:`hwprofile.device.detect`, then
:func:`hwprofile.profiles.build_profile`) gives, and ``tests/device/test_device.py`` that no thread is left.

Below :mod:`hwprofile.profiles`, which calls it: what it needs from there (the registry loader, the
profile builder) is passed in, so it imports neither profiles nor the registry.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from . import device as _device
from ._log import get_logger

if TYPE_CHECKING:
    import threading

    from .device import Detection, DeviceInfo, PluginCatalog
    from .registry import Registry

log = get_logger("hwprofile.device")  # the probe's messages are about detection
_P = TypeVar("_P")


class PendingDetection:
    """A :func:`detect` that may still be running in a helper thread (see :func:`detect_in_background`)."""

    def __init__(self, key: _device._Key, done: Detection | None = None) -> None:
        self._key, self._detection = key, done
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if done is not None:
            return
        import threading

        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hwprofile-nvml-probe", daemon=True)
        self._thread.start()

    def _publish(self, detection: Detection) -> None:
        self._detection = detection
        self._ready.set()

    def _run(self) -> None:
        try:
            detection = _device._detect(*self._key, publish=self._publish)
            if self._detection is None:
                self._publish(detection)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread by result() or close()
            self._error = exc
        finally:
            self._ready.set()

    def result(self) -> Detection:
        """The detected devices, as soon as NVML has reported them (its teardown may still run)."""
        if self._thread is not None:
            self._ready.wait()
        if self._detection is None:
            assert self._error is not None
            raise self._error
        return _device._detections.setdefault(self._key, self._detection)

    def close(self) -> None:
        """Wait for the helper thread to end (NVML shut down); a teardown error is logged."""
        if self._thread is not None:
            self._thread.join()
            if self._error is not None and self._detection is not None:
                log.warning(
                    "NVML failed while shutting down after detection (%s: %s); the devices it reported are used. "
                    "If NVML misbehaves later in this process, check the driver with 'hwprofile doctor'",
                    type(self._error).__name__, self._error,
                )


def detect_in_background(environ: Mapping[str, str] | None = None, plugin_catalog: PluginCatalog | None = None) -> PendingDetection:
    """Start :func:`detect` in a helper thread; ``result()`` waits for the devices, ``close()`` for the thread.

    NVML's start-up spends most of its 15-20 ms inside the driver with the GIL released
    (``nvmlInit``, the first device handle, ``nvmlShutdown``), so ``profile()`` loads the plugins
    meanwhile, and resolves while NVML shuts down. ``pynvml`` is imported here, in the calling
    thread: importing is Python work that would only contend for the GIL. Nothing to wait for
    (cached, simulated, no nvidia-ml-py, no threads) means detecting at once. The caller must call
    ``close()``, so that no thread outlives it (a process may fork right after). ``plugin_catalog``
    as for :func:`hwprofile.device.detect` (a simulated device is detected at once, in this thread).
    """
    key = _device._key(environ)
    if key in _device._detections or key[0]:
        return PendingDetection(key, _device.detect(environ, plugin_catalog))
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return PendingDetection(key, _device.detect(environ, plugin_catalog))
    try:
        return PendingDetection(key)
    except RuntimeError:  # interpreter shutting down, or no more threads
        return PendingDetection(key, _device.detect(environ, plugin_catalog))


def first_profile(
    index: int, registry: Callable[[], Registry], build: Callable[[DeviceInfo, Registry, Mapping[str, str]], _P]
) -> _P:
    """The first profile of the process, with NVML's start-up overlapped.

    NVML starts in a helper thread (:func:`detect_in_background`) while this thread imports and
    registers the plugins (``registry()``, the caller's process-wide loader); then resolving
    (``build(device, registry, os.environ)``: :func:`hwprofile.profiles.build_profile`) overlaps
    NVML's teardown. A simulated device that only a plugin's catalog entry names is looked up
    through ``registry().catalog_entries()``.
    """
    probe = detect_in_background(plugin_catalog=lambda: registry().catalog_entries())
    try:
        error: Exception | None = None
        try:
            reg = registry()
            import hashlib  # noqa: F401 - resolving needs it (digests, fingerprint): import it while NVML starts
        except Exception as exc:  # noqa: BLE001 - re-raised below, after a missing device is reported (as when detection ran first)
            error = exc
        info = probe.result().device(index)
        if error is not None:
            raise error
        return build(info, reg, os.environ)
    finally:
        probe.close()  # no thread outlives profile(): the process may fork next
