"""The distributions hwprofile imports, by module: a missing one is an installation problem, said in one line.

Never imports them itself: it words an ``ImportError`` a caller caught (``missing``), or asks whether a
module could be imported without importing it (``absent``). Every command reaches a missing
dependency through :func:`missing` (``hwprofile.cli``), and ``hwprofile doctor`` reports each one with
its install command and goes on with what it can read without it.
"""

from __future__ import annotations

import importlib.util
from typing import Final

from ._record import Record, final
from .errors import MissingDependencyError


def cuda_extra() -> str:
    """The commands that install hwprofile's CUDA extras, from where hwprofile came (:mod:`hwprofile._install`)."""
    from ._install import hwprofile_extra

    return f"{hwprofile_extra('cu13')} (CUDA 13 driver, 580+) or {hwprofile_extra('cu12')} (CUDA 12 driver)"


@final
class Dependency(Record):
    distribution: str  #: what pip installs
    command: str  #: the command that installs it ("": an extra of hwprofile, :func:`cuda_extra`, composed when asked)
    needed_for: str  #: what stops working without it

    @property
    def install(self) -> str:
        """The command that installs it: a third-party distribution by its name on the index, hwprofile's own
        extras from the checkout or git URL hwprofile came from, never by bare name (:mod:`hwprofile._install`)."""
        return self.command or cuda_extra()


#: top-level module (or a dotted prefix, the longest wins) -> the distribution it comes from
DEPENDENCIES: Final[dict[str, Dependency]] = {
    "pluggy": Dependency("pluggy", "pip install 'pluggy>=1.5'", "loading the plugins (every profile)"),
    "pynvml": Dependency("nvidia-ml-py", "pip install nvidia-ml-py", "finding the GPUs (NVML): without it hwprofile sees none"),
    "platformdirs": Dependency("platformdirs", "pip install 'platformdirs>=3'", "the kernel cache and config directories"),
    "filelock": Dependency("filelock", "pip install 'filelock>=3.20.3'", "the kernel cache's locks"),
    "tomli_w": Dependency("tomli-w", "pip install 'tomli-w>=1.0'", "writing tuned files"),
    "cuda.pathfinder": Dependency("cuda-pathfinder", "pip install 'cuda-pathfinder>=1.1'", "finding the CUDA headers and NVRTC"),
    "cuda": Dependency("cuda-bindings", "", "compiling (NVRTC) and launching kernels"),
}

#: NVRTC, the library cuda-bindings loads on its first call (not a module: :func:`hwprofile.kernels.nvrtc_version` loads it)
NVRTC: Final = Dependency("nvidia-cuda-nvrtc", "", "compiling kernels")


def _dependency(module: str) -> Dependency | None:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        found = DEPENDENCIES.get(".".join(parts[:i]))
        if found is not None:
            return found
    return None


def text(dep: Dependency, why: str = "") -> str:
    """One line: what is missing, what needs it, and the command that installs it."""
    return f"{dep.distribution} is not installed{f' ({why})' if why else ''}; it is needed for {dep.needed_for}: {dep.install}"


def missing(exc: BaseException) -> MissingDependencyError | None:
    """The error naming the distribution and its install command, when ``exc`` is the ``ImportError`` of a
    module that one of :data:`DEPENDENCIES` provides; ``None`` for anything else (a bug stays a bug)."""
    if isinstance(exc, MissingDependencyError):
        return exc
    if not isinstance(exc, ImportError) or not exc.name:
        return None
    dep = _dependency(exc.name)
    if dep is None:
        return None
    return MissingDependencyError(text(dep, f"import {exc.name} failed: {exc}"))


def absent(module: str) -> Dependency | None:
    """The dependency providing ``module`` when it cannot be imported here (found without importing it), else ``None``."""
    dep = _dependency(module)
    if dep is None:
        raise KeyError(f"{module!r} is no module of hwprofile's dependencies: {', '.join(DEPENDENCIES)}")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent that is missing, or a module without a spec
        spec = None
    return dep if spec is None else None
