"""Every hook a hwprofile plugin can implement, documented where it is declared.

Two kinds of plugin implement these hooks:

* an **architecture plugin** implements :func:`hwprofile_arch` and serves exact compute
  capabilities; exactly one is selected per device and only that one takes part in the profile;
* any other plugin (a downstream engine) takes part in every profile and is layered above the
  architecture plugin, in pluggy's order (``trylast`` lowest, ``tryfirst`` highest).

Every hook is called once per plugin, so each value is attributed to the distribution that
supplied it. A hook that raises is reported with the plugin's name, distribution and version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .catalog import CatalogEntry
    from .device import DeviceInfo
    from .jit import KernelSpec
    from .registry import ArchSpec
    from .settings import EnvDefault, Setting

PROJECT = "hwprofile"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def hwprofile_arch() -> ArchSpec | None:
    """Declare this plugin an architecture plugin.

    Return an :class:`~hwprofile.ArchSpec` mapping each *exact* compute capability served to its
    NVRTC target, e.g. ``ArchSpec({(10, 0): "sm_100a", (10, 3): "sm_103a"})``. Matching never uses
    the major number alone: ``sm_121`` is not ``sm_120``. Return ``None`` (or do not implement the
    hook) for a plugin that is not an architecture plugin. Called once, when plugins are loaded.
    """


@hookspec
def hwprofile_declare_settings() -> Iterable[Setting] | None:
    """Declare new settings, each key in this plugin's own namespace (``"<plugin name>.<key>"``).

    Declared settings get an env-var override like core's (``HWPROFILE_<KEY>``) and can be set by
    any layer. Declaring a key that core or another plugin declares is an error naming both.
    """


@hookspec
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Return setting values for ``device``, keyed by declared setting key.

    ``resolved`` is a read-only view of every value resolved by the layers below this plugin
    (core defaults, the architecture plugin, lower-priority downstream plugins), so a plugin can
    see and change the merged result. Values may be plain or wrapped in :class:`~hwprofile.Value`
    to carry a reason (for a threshold: what it was measured against). Undeclared keys, wrong types
    and out-of-bounds values are errors naming this plugin. The tuned-thresholds file and the
    user's ``HWPROFILE_*`` variables still rank above every plugin.
    """


@hookspec
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> Mapping[str, EnvDefault] | None:
    """Return environment-variable defaults for ``device``: name -> :class:`~hwprofile.EnvDefault`.

    These are variables other libraries or the engine read from ``os.environ``
    (``TORCH_CUDA_ARCH_LIST``, feature flags). ``settings`` holds the fully resolved settings.
    Defaults are never written at import or by ``profile()``: only ``Profile.apply_env()`` writes
    them, and only those the user has not set (any present value, even ``""``, counts as set).
    """


@hookspec
def hwprofile_kernels(device: DeviceInfo, target: str) -> Iterable[KernelSpec] | None:
    """Return the CUDA kernels this plugin provides for ``device``, compiled by NVRTC for ``target``.

    ``target`` is the selected architecture plugin's NVRTC target for the device (``"sm_90a"``);
    it is also passed when ``hwprofile compile --arch`` pre-builds kernels with no GPU present.
    A kernel with the same op name from a higher-priority plugin replaces a lower one.
    """


@hookspec
def hwprofile_catalog() -> Mapping[str, CatalogEntry] | None:
    """Contribute simulated devices: catalog name -> :class:`~hwprofile.CatalogEntry`.

    Lets CI exercise a GPU generation that hwprofile's built-in catalog does not know, by name
    (``HWPROFILE_DEVICE=jetson-thor``, ``hwprofile show --simulate jetson-thor``,
    ``--hwprofile-device=jetson-thor``), with its real SM count, shared memory and memory. An
    architecture plugin typically contributes one entry per GPU it serves; any plugin may
    implement it.

    :return: a mapping of lower-case names (letters, digits, ``-``) to entries, or ``None``.

    **When it is called:** only when a simulated-device name is neither built in nor a generic
    capability (``sm_110``, ``11.0``, which need no plugin), and by ``hwprofile devices``; once per
    plugin per lookup, so it must be pure and cheap (return module-level constants).

    **Errors:** a name that is built in, generic, malformed or contributed by two plugins, a value
    that is not a ``CatalogEntry``, or a raise inside the hook is a :class:`~hwprofile.PluginError`
    naming the plugin's distribution and version.
    """
