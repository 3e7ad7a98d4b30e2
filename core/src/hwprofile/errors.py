"""Exceptions a user can hit. Each message says what went wrong, where, and what to do."""

from __future__ import annotations


class HwprofileError(Exception):
    """Base class of every error hwprofile raises on purpose."""


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
