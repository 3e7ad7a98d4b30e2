"""Exceptions a user can hit. Each message says what went wrong, where, and what to do.

Never imports another hwprofile module but :mod:`hwprofile._redact` (which imports none), not even for
the type checker: every module imports this one, so any other import here would put it in an import
circle with all of them.
"""

from __future__ import annotations

from typing import Any

from ._redact import redact


class HwprofileError(Exception):
    """Base class of every error hwprofile raises on purpose; its message passes :func:`hwprofile._redact.redact`."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class DeviceError(HwprofileError, LookupError):
    """A device index or simulated-device name that does not exist."""


class PluginError(HwprofileError):
    """A plugin failed to import, broke a hook contract, or conflicts with another plugin."""


class SettingError(HwprofileError, ValueError):
    """A setting value (from a plugin, a tuned file or the environment) is undeclared or invalid."""


class KernelError(HwprofileError):
    """A kernel could not be compiled, loaded or launched."""


class KernelCompileError(KernelError):
    """NVRTC rejected a kernel; the message carries the NVRTC log."""


class ToolchainError(KernelError):
    """NVRTC, the CUDA headers or the driver are missing or too old for the target."""


class CacheError(KernelError):
    """The kernel cache cannot be used (a shared, foreign or unusable directory, a bad HWPROFILE_CACHE)."""


class MissingDependencyError(HwprofileError, ImportError):
    """A distribution hwprofile needs is not installed (an installation problem, not a bug): the message
    names the distribution and the command that installs it (``hwprofile._deps``)."""


class WriteError(HwprofileError, OSError):
    """A file hwprofile writes for the user (a tuned file, sweep output, a new plugin) could not be written whole.

    The previous file is left as it was; the message names the file and what to do.
    """


class AgreementError(HwprofileError):
    """The ranks of a torch.distributed group resolved different profiles, or not all of them took part.

    Raised on every rank that called :func:`hwprofile.distributed.check_agreement`. ``differences``
    names each differing key with the values, provenance and ranks holding them; ``missing`` lists
    the ranks that had not called it when a timeout or a failed collective ended the wait; ``ranks``
    holds the per-rank summaries when they were gathered (for a table).
    """

    def __init__(
        self, message: str, *, differences: tuple[Any, ...] = (), missing: tuple[int, ...] = (), ranks: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(message)
        #: :class:`hwprofile.distributed.Difference` objects (typed ``Any`` here: this module imports nothing).
        self.differences: tuple[Any, ...] = differences
        self.missing: tuple[int, ...] = missing
        #: :class:`hwprofile.distributed.RankSummary` objects.
        self.ranks: tuple[Any, ...] = ranks


class NotWarmedError(HwprofileError):
    """An op's first call of a shape came inside a CUDA-graph capture, and neither its kernel nor its fallback was ready.

    Compiling or loading a module there, or the fallback's first cuBLAS call (``cublasCreate``),
    would invalidate the capture; this error is raised instead, before anything reaches the stream.
    """


class NotVerifiedError(NotWarmedError):
    """A kernel instance with no verdict on this device was first called inside a CUDA-graph capture.

    Verifying it there would put its check into the graph; taking it unverified could record a wrong
    kernel. Warm up (``hwprofile.ops.warmup``) or call the op once at that shape before capturing.
    """
