"""The kernel pipeline: spec -> NVRTC -> cache -> loaded function -> launch. Never imports settings, registry, profiles or ops.

One stage per module, as cuda.core splits them:

* :mod:`~hwprofile.kernels.spec`: what a plugin ships (:class:`KernelSpec`, :class:`Launch`), its source digest
  (the bottom stage: it imports no other);
* :mod:`~hwprofile.kernels.headers`: which CUDA header directory matches NVRTC's major;
* :mod:`~hwprofile.kernels.toolchain`: NVRTC and typed :class:`CompileOptions`;
* :mod:`~hwprofile.kernels.cache`: the on-disk cache (key schema, directory policy, entry format, locking);
* :mod:`~hwprofile.kernels.launch`: module loading, argument packing, launching;
* :mod:`~hwprofile.kernels.skinny_gemm`: the shared skinny-GEMM/GEMV kernel family plugins instantiate;
* ``_pipeline``: the stages joined (:func:`compile_spec`, :func:`load`) behind one fault contract:
  nothing but a :class:`~hwprofile.errors.KernelError` leaves :func:`load`, so an op turns any cache,
  toolchain or driver fault into its one documented warning and the torch fallback.

The face below is loaded lazily (PEP 562) for one reason: plugins import :mod:`.spec` while the first
``profile()`` runs, and importing a submodule imports this package first. If this module imported
``_pipeline`` (toolchain, cache, launch, and the ``json`` the cache keys are hashed with) every first
``profile()`` would pay for a compiler it may never call (tests/package/test_import.py::test_first_profile_leaves_slow_modules_unloaded
holds it). Attributes are looked up on each access and never copied here, so a test that patches
``_pipeline`` is seen by every caller. The pipeline reads its variables (``HWPROFILE_CACHE``,
``HWPROFILE_CACHE_DIR``) through :mod:`hwprofile._env`, never through the settings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type checker reads the face through _pipeline's own exports ("X as X" or defined there)
    from ._pipeline import *  # noqa: F403

#: the face, written once: each name is one that ``_pipeline`` defines or hands on, and nothing else of it is
#: (tests/package/test_import_graph.py::test_kernels_face_is_the_pipelines)
__all__ = [  # noqa: F405 - for the type checker, the names come from the star import above
    "MIN_NVRTC",
    "CompileForbiddenError",
    "CompileOptions",
    "CompileReport",
    "CompiledKernel",
    "KernelSpec",
    "Launch",
    "LoadedKernel",
    "Recorder",
    "cache_dir",
    "cache_enabled",
    "cache_key",
    "check_driver_for_nvrtc",
    "check_target",
    "check_toolchain",
    "clear_cache",
    "compile_all",
    "compile_spec",
    "counters",
    "cuda_headers",
    "driver_cuda_version",
    "fill_layer",
    "forbid_compile",
    "include_dirs",
    "load",
    "loaded",
    "nvrtc_archs",
    "nvrtc_version",
]
_FACE = frozenset(__all__)


def __getattr__(name: str) -> object:
    if name not in _FACE:
        raise AttributeError(f"module 'hwprofile.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}._pipeline"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
