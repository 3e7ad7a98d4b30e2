"""Every hook a hwprofile plugin can implement, with its whole contract where it is declared.

Never imports anything heavy: plugins import :data:`hookimpl` from here (through
:mod:`hwprofile.plugin`) while the first ``profile()`` runs.

Two kinds of plugin implement these hooks:

* an **architecture plugin** implements :func:`hwprofile_arch` and serves exact compute
  capabilities; exactly one is selected per device, and of all architecture plugins only that one
  takes part in the device's profile;
* any other plugin (a downstream engine) takes part in every profile and is layered above the
  architecture plugin, in pluggy's order (``trylast`` lowest, ``tryfirst`` highest).

Rules common to every hook:

* **One plugin at a time.** hwprofile calls each hook on one plugin at a time (its own wrappers
  included), lowest layer first, so that every value is attributed to the distribution that
  supplied it. No hook is ``firstresult``; a plugin's result never hides another's.
* **When.** :func:`hwprofile_arch` is called when the plugin is registered; the other hooks when a
  profile is resolved: once per device and process, and again after ``hwprofile.reset()`` (a
  plugin's own tests, through ``profile_for``, resolve more often). Resolving happens inside the
  engine's first ``hwprofile.profile()``, usually at start-up. The exceptions:
  :func:`hwprofile_catalog` is called when a simulated device is looked up by a name only a plugin
  knows, and ``hwprofile compile`` resolves no profile but calls :func:`hwprofile_declare_settings`
  on every plugin and :func:`hwprofile_kernels` on every architecture plugin.
* **Pure and cheap.** A hook must return the same answer for the same arguments, must not import
  torch, create a CUDA context, read the GPU, write files or ``os.environ``: ``device`` may be
  **simulated** (``device.simulated``: a catalog entry or a bare capability, no GPU behind it), and
  hooks run in CI on machines without one. Decide from ``device.compute_capability`` and the
  other :class:`~hwprofile.DeviceInfo` facts; ``device.attributes()`` may initialise CUDA and
  belongs in kernels' launch code, not in hooks.
* **Errors.** A hook that raises makes resolving fail with a :class:`~hwprofile.PluginError` that
  names the hook, the plugin, its distribution and version, and the original exception (chained);
  a :class:`~hwprofile.PluginError` raised by the hook passes through unchanged. A result of the
  wrong type or shape is a :class:`~hwprofile.PluginError` or :class:`~hwprofile.SettingError`
  naming the plugin as well. Nothing a plugin returns is dropped silently.
* **None** from a hook, or not implementing it, means "nothing to add".

Two hooks are not resolving hooks but the seams through which the layers below reach the tools
above them (the layers below never import those tools: ``tests/package/test_import_graph.py``):
:func:`hwprofile_first_profile` (``profile()`` hands a device's first profile over, where core's
re-tuner runs under ``HWPROFILE_TUNE=stale``) and :func:`hwprofile_check_kernels` (``hwprofile.ops``
asks before a device's kernels are first dispatched, where core's self-test runs under
``HWPROFILE_SELFTEST=1``). Core implements both in :mod:`hwprofile._core_plugin`, registered like any
other plugin, by the entry point ``hwprofile`` of its own distribution. They are the exceptions to
"pure and cheap": they are never called on a simulated device, and may use the GPU.

Not a hook: a package that ships **prebuilt kernels** (a read-only kernel cache layer, e.g. a
``hwprofile-sm90-cubins`` wheel written by ``hwprofile compile --package``) declares an entry point in
the group ``hwprofile.cubins`` (``name = "package"``, the layer being ``<package>/cubins``), which the
kernel cache finds without loading any plugin or importing the package
(:data:`hwprofile.kernels.cache.LAYER_GROUP`): a layer is data, and the cache sits below the registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from ._registry_records import ArchSpec, PluginInfo
    from .catalog import CatalogEntry
    from .device import DeviceInfo
    from .kernels.spec import KernelSpec
    from .settings import EnvDefault, Setting

PROJECT = "hwprofile"


class ProfileView(Protocol):
    """The ``profile`` a seam hook receives and may return: a :class:`hwprofile.Profile`, typed by what a hook reads.

    A protocol, so that this module imports no profile (the registry imports this module, and profiles the
    registry: a circle, type-checking imports counted, tests/package/test_import_graph.py).
    """

    @property
    def device(self) -> DeviceInfo: ...  # the device profiled
    @property
    def plugin(self) -> PluginInfo | None: ...  # the selected architecture plugin
    @property
    def target(self) -> str | None: ...  # its NVRTC target
    @property
    def kernels(self) -> Mapping[str, KernelSpec]: ...  # op -> kernel
    @property
    def fingerprint(self) -> str: ...  # the profile's fingerprint
    def __getitem__(self, key: str) -> Any: ...  # a resolved setting's value

hookspec = pluggy.HookspecMarker(PROJECT)
#: Marks a plugin's hook implementation: ``@hookimpl`` (or ``@hookimpl(tryfirst=True)`` to rank a
#: downstream plugin above the others).
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def hwprofile_arch() -> ArchSpec | None:
    """Declare this plugin an architecture plugin, and which exact compute capabilities it serves.

    :returns: an :class:`~hwprofile.ArchSpec` mapping each *exact* capability served to its NVRTC
        target, e.g. ``ArchSpec({(10, 0): "sm_100a", (10, 3): "sm_103a"})``. Matching never uses
        the major number alone: ``sm_121`` is not ``sm_120``. ``None`` (or not implementing the
        hook): this plugin is not an architecture plugin, it is layered as a downstream plugin.

    Called once per plugin when it is registered (once per process, again after
    ``hwprofile.reset()``), before any device is known: the answer may not depend on the device.
    Two plugins claiming the same capability is an error naming both (unless one is pinned with
    ``HWPROFILE_PLUGIN`` or disabled with ``HWPROFILE_DISABLE_PLUGINS``). An entry that is not
    ``(int, int) -> "sm_XY[a|f]"``, or a result that is not an ``ArchSpec``, is a ``PluginError``.
    """


@hookspec
def hwprofile_declare_settings() -> Iterable[Setting] | None:
    """Declare new settings, each key in this plugin's own namespace (``"<plugin name>.<key>"``).

    :returns: the :class:`~hwprofile.Setting` declarations (name, type, default, bounds or
        choices, doc, bit-identity), or ``None``.

    Called once per profile resolved (per device, again after ``hwprofile.reset()``), on the
    selected architecture plugin and every downstream plugin, before any value is set; and once
    per plugin by ``hwprofile compile``, which checks the environment against every declaration. Declared
    settings get an environment override like core's (``HWPROFILE_<KEY>``) and can be set by any
    layer. A key outside the plugin's namespace, or declared by core or another plugin, is a
    ``SettingError`` naming both declarers.
    """


@hookspec
def hwprofile_settings(device: DeviceInfo, resolved: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Return setting values for ``device``, keyed by declared setting key.

    :param device: the device being profiled; may be simulated (see the module's rules).
    :param resolved: a read-only view of every value resolved by the layers below this plugin
        (core defaults, the architecture plugin, lower-priority downstream plugins), so a plugin
        can see the merged result and change any key.
    :returns: ``{key: value}``, where a value is plain or wrapped in :class:`~hwprofile.Value` to
        carry a reason and, for a measured threshold, the :class:`~hwprofile.plugin.Stamp` of
        what it was measured against; or ``None``.

    Called once per profile resolved, first on the selected architecture plugin, then on each
    downstream plugin from ``trylast`` to ``tryfirst``; each call sees the results of the calls
    before it. Undeclared keys, wrong types and out-of-bounds values are errors (``SettingError``)
    naming this plugin. The tuned-thresholds file and the user's ``HWPROFILE_*`` variables still
    rank above every plugin: a plugin never overrides the user.
    """


@hookspec
def hwprofile_env_defaults(device: DeviceInfo, settings: Mapping[str, Any]) -> Mapping[str, EnvDefault] | None:
    """Return environment-variable defaults for ``device``: name -> :class:`~hwprofile.EnvDefault`.

    :param device: the device being profiled; may be simulated.
    :param settings: the fully resolved settings (every layer, user variables included), read-only.
    :returns: ``{variable name: EnvDefault(value, reason, bit_identical)}``, or ``None``. A later
        (higher-priority) plugin's default for the same variable replaces an earlier one's.

    These are variables other libraries or the engine read from ``os.environ``
    (``TORCH_CUDA_ARCH_LIST``, feature flags). Called once per profile resolved, after every
    setting is resolved, in the order of :func:`hwprofile_settings`. Defaults are never written at
    import or by ``profile()``: only ``Profile.apply_env()`` writes them, and only those the user
    has not set (any present value, even ``""``, counts as set). A value that is not an
    ``EnvDefault`` with a ``str`` value is a ``PluginError``.
    """


@hookspec
def hwprofile_kernels(device: DeviceInfo, target: str) -> Iterable[KernelSpec] | None:
    """Return the CUDA kernels this plugin provides for ``device``, compiled by NVRTC for ``target``.

    :param device: the device being profiled; may be simulated, and is always simulated when
        ``hwprofile compile --arch`` pre-builds kernels with no GPU present.
    :param target: the selected architecture plugin's NVRTC target for the device (``"sm_90a"``).
    :returns: :class:`~hwprofile.KernelSpec` objects (source shipped as package data, instances,
        launch plan), or ``None``. A kernel with the same op name from a higher-priority plugin
        replaces a lower one's.

    Called once per profile resolved when an architecture plugin serves the device (before the
    settings hooks: the kernels' source digests decide whether measured thresholds are stale), on
    the selected architecture plugin, then downstream plugins; and by ``hwprofile compile`` once per
    (architecture plugin, target), never on a downstream plugin (its kernels compile on first use
    only). Returning specs compiles nothing: kernels are compiled on first use or by ``hwprofile
    compile``. A result that is not a ``KernelSpec``, or a source missing from the
    package, is a ``PluginError``.
    """


@hookspec
def hwprofile_catalog() -> Mapping[str, CatalogEntry] | None:
    """Contribute simulated devices: catalog name -> :class:`~hwprofile.plugin.CatalogEntry`.

    Lets CI exercise a GPU generation that hwprofile's built-in catalog does not know, by name
    (``HWPROFILE_DEVICE=jetson-thor``, ``hwprofile show --simulate jetson-thor``,
    ``--hwprofile-device=jetson-thor``), with its real SM count, shared memory and memory. An
    architecture plugin typically contributes one entry per GPU it serves; any plugin may
    implement it.

    :returns: a mapping of lower-case names (letters, digits, ``-``) to entries, or ``None``.

    **When it is called:** only when a simulated-device name is neither built in nor a generic
    capability (``sm_110``, ``11.0``, which need no plugin), and by ``hwprofile devices``; once per
    plugin per lookup, so it must be pure and cheap (return module-level constants).

    **Errors:** a name that is built in, generic, malformed or contributed by two plugins, a value
    that is not a ``CatalogEntry``, or a raise inside the hook is a :class:`~hwprofile.PluginError`
    naming the plugin's distribution and version.
    """


# --- seams: the layers below handing over to the tools above ----------------------------------------------------


@hookspec
def hwprofile_first_profile(profile: ProfileView) -> ProfileView | None:
    """Take over a real device's first profile before ``profile()`` returns it (core: re-tune stale thresholds).

    :param profile: the device's freshly resolved profile, already cached: ``hwprofile.profile()`` for
        this device returns it meanwhile, in this thread and in others.
    :returns: the profile ``profile()`` should return instead (one resolved again, e.g. after new tuned
        files were written: :func:`hwprofile.profiles` caches it), or ``None`` to keep ``profile``.

    **When:** once per real device and process (again after ``hwprofile.reset()``), by the thread whose
    ``profile()`` resolved it, after resolving, with profiles' lock released; never on a simulated
    device, and never again while the thread is inside this hook (profiles resolved by the hook do
    not call it). Called on the selected architecture plugin, then each downstream plugin in
    pluggy's order; each sees the profile the one before returned.

    **May** measure on the GPU (the exception to "pure and cheap"). A raise is a
    :class:`~hwprofile.PluginError` naming the plugin, as for every hook; core's implementation never
    raises (a failed tuning is a warning, and the values already there apply). A result that is not
    a ``Profile`` of the same device is a ``PluginError``.
    """


@hookspec
def hwprofile_check_kernels(profile: ProfileView) -> Mapping[str, str] | None:
    """Say which of a real device's kernels must not be dispatched (core: the opt-in self-test).

    :param profile: the profile whose dispatch table ``hwprofile.ops`` is building.
    :returns: ``{op: why}`` for each op whose kernel must not run on this device (the op takes its
        torch fallback there, with one warning naming the op, the device and ``why``; with
        ``HWPROFILE_STRICT=1`` a :class:`~hwprofile.KernelError` instead), or ``None``.

    **When:** each time ``hwprofile.ops`` builds a dispatch table for a real device: its first op
    call, and again when the device's profile changed (tuning, ``hwprofile.reset()``); never for a
    simulated device. It runs under the dispatch tables' lock, before any op uses the table: other
    threads' ops on any device wait for it. The hook may run the profile's kernels through
    ``hwprofile.ops`` (``run_kernel``: the table being built is the one it gets). Called on the
    selected architecture plugin, then each downstream plugin in pluggy's order.

    An op that is not in the op table, or a reason that is not a string, is a ``PluginError``.
    """
