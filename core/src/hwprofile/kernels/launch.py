"""Driver side of the kernel pipeline: module loading, argument packing, launching. Never compiles.

cuda.core's ``ObjectCode -> Kernel -> launch(stream, config, *args)`` stage. Modules are loaded
into torch's primary context of the device, memoised by the cubin's cache key (a hash of every
compile input), so a source edit followed by ``hwprofile.reset()`` can never return the old function. Launches go to
the stream handle the caller passes (``torch.cuda.current_stream()``), so CUDA graphs capture them.

cuda-python and torch are imported only when a module is loaded.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from .. import _state
from ..errors import KernelError, ToolchainError
from .spec import Launch


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        from .._install import hwprofile_extra

        raise ToolchainError(f"cuda-python is not installed ({exc}); {hwprofile_extra('cu13')}") from None
    return driver


def _cu(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings driver result tuple, raising on error."""
    cu = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise KernelError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def driver_cuda_version() -> tuple[int, int] | None:
    """The driver's CUDA version, through the driver API (initialises it), or None without a driver."""
    try:
        cu = _driver()
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        v = _cu(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        return int(v) // 1000, (int(v) % 1000) // 10
    except Exception:  # noqa: BLE001 - no driver is an answer here, not an error
        return None


def check_driver_for_nvrtc(driver: tuple[int, int] | None) -> str | None:
    """A plain-words problem if cubins from this NVRTC cannot load on this driver, else None."""
    if driver is None:
        return None
    from .toolchain import nvrtc_version

    nv = nvrtc_version()
    if nv[0] > driver[0]:
        return (
            f"NVRTC {nv[0]}.{nv[1]} makes cubins that need a CUDA {nv[0]} driver, but the driver supports CUDA "
            f"{driver[0]}.{driver[1]}; install 'hwprofile[cu{driver[0]}]' or upgrade the driver"
        )
    return None


class ArgPack:
    """Pre-packed ``void**`` argument array: per launch only the slot values change (no allocation)."""

    def __init__(self, types: Sequence[type]) -> None:
        self.slots = [t() for t in types]
        self.array = (ctypes.c_void_p * len(types))(*[ctypes.addressof(s) for s in self.slots])
        self.address = ctypes.addressof(self.array)


class LoadedKernel:
    """A function loaded into torch's context of one device, with a reusable argument pack."""

    def __init__(self, function: Any, name: str, arg_types: Sequence[type]) -> None:
        self.function = function
        self.name = name
        self._pack = ArgPack(arg_types)
        self._lock = threading.Lock()
        self._cu = _driver()
        self._smem_set = 0
        self._pdl_configs: dict[tuple[Launch, int], Any] = {}

    def launch(self, launch: Launch, stream: int, args: Sequence[Any]) -> None:
        """Launch on ``stream`` (a CUstream handle as int). Arguments must be checked by the caller.

        A ``launch`` with ``pdl`` set goes through ``cuLaunchKernelEx`` with programmatic stream
        serialization (its per-launch attributes built once per launch and stream).
        """
        cu = self._cu
        if launch.shared_bytes > 48 * 1024 and launch.shared_bytes > self._smem_set:
            _cu(
                cu.cuFuncSetAttribute(
                    self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.shared_bytes
                ),
                f"raising the shared-memory limit of {self.name} to {launch.shared_bytes} bytes",
            )
            self._smem_set = launch.shared_bytes
        g, b = launch.grid, launch.block
        with self._lock:
            for slot, value in zip(self._pack.slots, args, strict=True):
                slot.value = value
            if launch.pdl:
                cfg = self._pdl_configs.get((launch, stream))
                if cfg is None:
                    cfg = self._pdl_configs[(launch, stream)] = _pdl_config(cu, launch, stream)
                (err,) = cu.cuLaunchKernelEx(cfg, self.function, self._pack.address, 0)
            else:
                (err,) = cu.cuLaunchKernel(
                    self.function, g[0], g[1], g[2], b[0], b[1], b[2], launch.shared_bytes, stream, self._pack.address, 0
                )
        if err != cu.CUresult.CUDA_SUCCESS:
            _cu(err, f"launching {self.name} grid={g} block={b} smem={launch.shared_bytes}")


def _pdl_config(cu: Any, launch: Launch, stream: int) -> Any:
    """A reusable launch configuration with programmatic stream serialization (built once per launch and stream)."""
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = launch.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = launch.block
    cfg.sharedMemBytes = launch.shared_bytes
    cfg.hStream = stream
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


_modules: dict[tuple[str, int], Any] = {}
_modules_lock = threading.Lock()


@_state.in_forked_child
def _reinit_locks_in_child() -> None:
    global _modules_lock
    _modules_lock = threading.Lock()  # a thread of the parent may have held it at the fork



def load_function(key: str, cubin: bytes, lowered_name: str, device_index: int, *, what: str) -> Any:
    """The ``CUfunction`` ``lowered_name`` of ``cubin`` in torch's context of ``device_index``.

    Modules are memoised per (cache key, device): the key is a hash of every compile input.
    """
    cu = _driver()
    mod_key = (key, device_index)
    with _modules_lock:
        module = _modules.get(mod_key)
    if module is None:
        import torch

        if not torch.cuda.is_available():
            raise KernelError(f"cannot load {what}: no CUDA device is available to this process")
        torch.cuda.init()
        dev = _cu(cu.cuDeviceGet(device_index), "cuDeviceGet")
        ctx = _cu(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")  # torch's context
        _cu(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            module = _cu(cu.cuModuleLoadData(cubin), f"loading the cubin of {what}")
        finally:
            _cu(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
        with _modules_lock:
            module = _modules.setdefault(mod_key, module)
    return _cu(cu.cuModuleGetFunction(module, lowered_name.encode()), f"finding {lowered_name} in {what}")


@_state.on_reset
def clear_cache() -> None:
    """Forget loaded modules (they stay loaded in the context; functions already handed out keep working)."""
    with _modules_lock:
        _modules.clear()
