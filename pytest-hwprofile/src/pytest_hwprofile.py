"""pytest plugin for hwprofile (entry point ``pytest11``): simulated devices, architecture and GPU markers.

* ``--hwprofile-device=NAME`` (or ``HWPROFILE_DEVICE``) simulates a GPU for the session: a catalog
  name (``h200``), a generic capability (``sm_110``, ``11.0``) or a comma list. A name that is not
  known is one usage error at start-up, not one error per test.
* ``@pytest.mark.hwprofile_arch("sm_120", "sm_121")`` runs a test only when device 0 has one of
  these *exact* capabilities (real or simulated), and skips it with the reason otherwise.
* ``@pytest.mark.hwprofile_gpu("sm_90")`` needs a *real* GPU (of that capability, if given) usable
  by torch; it skips cleanly without one, so CPU-only CI passes.
* fixtures: ``hwprofile_profile`` (device 0's profile; skips with the reason when there is no device)
  and ``hwprofile_simulate`` (switch the simulated device inside a test; the previous state is restored).

It is its own distribution, ``pytest-hwprofile``: pytest rewrites the asserts of every module of a
distribution that declares a ``pytest11`` entry point, and hwprofile's modules are library code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_SAVED_ENV = pytest.StashKey[str | None]()  # HWPROFILE_DEVICE before --hwprofile-device set it
SIMULATE_ENV = "HWPROFILE_DEVICE"  # hwprofile.device.SIMULATE_ENV; not imported here so that loading pytest imports no hwprofile


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hwprofile")
    group.addoption(
        "--hwprofile-device", default=None, metavar="NAME",
        help="simulate this GPU: a catalog name (h200), a capability (sm_110, 11.0), a comma list, or 'none'",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hwprofile_arch(*sms): run only when device 0 has one of these exact capabilities (sm_90, 12.1...)")
    config.addinivalue_line("markers", "hwprofile_gpu(*sms): needs a real GPU usable by torch (of one of these capabilities, if given)")
    name = config.getoption("--hwprofile-device", default=None)
    if not name or name.strip().lower() == "none":
        return
    from hwprofile import device
    from hwprofile.errors import DeviceError

    try:
        device.simulated_detection(name)
    except DeviceError as exc:
        raise pytest.UsageError(f"--hwprofile-device={name}: {exc}") from None
    config.stash[_SAVED_ENV] = os.environ.get(SIMULATE_ENV)
    os.environ[SIMULATE_ENV] = name
    from hwprofile.profiles import reset

    reset()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give the process its own HWPROFILE_DEVICE back (an in-process ``pytest.main`` must not leak it)."""
    if _SAVED_ENV not in config.stash:
        return
    before = config.stash[_SAVED_ENV]
    if before is None:
        os.environ.pop(SIMULATE_ENV, None)
    else:
        os.environ[SIMULATE_ENV] = before
    from hwprofile.profiles import reset

    reset()


def _parse_cc(s: str) -> tuple[int, int]:
    m = re.fullmatch(r"(?:sm_?)?(\d+)\.?(\d)[af]?", s.strip().lower())
    if not m:
        raise pytest.UsageError(f"hwprofile marker: {s!r} is not a capability; write 'sm_90', 'sm_121' or '9.0'")
    return int(m.group(1)), int(m.group(2))


def _device0(real: bool) -> tuple[Any, str]:
    from hwprofile import device

    det = device.detect({k: v for k, v in os.environ.items() if k != SIMULATE_ENV}) if real else device.detect()
    if not det.devices:
        return None, f"no device ({det.reason})"
    d = det.devices[0]
    return d, f"device 0 is {d.name} ({d.sm}{', simulated' if d.simulated else ''})"


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("hwprofile_arch"):
        wanted = {_parse_cc(a) for a in mark.args}
        d, desc = _device0(real=False)
        if d is None or d.compute_capability not in wanted:
            pytest.skip(f"needs {', '.join(sorted(f'sm_{a}{b}' for a, b in wanted))}; {desc}")
    for mark in item.iter_markers("hwprofile_gpu"):
        d, desc = _device0(real=True)
        if d is None:
            pytest.skip(f"needs a real NVIDIA GPU; {desc}")
        wanted = {_parse_cc(a) for a in mark.args}
        if wanted and d.compute_capability not in wanted:
            pytest.skip(f"needs a real {', '.join(sorted(f'sm_{a}{b}' for a, b in wanted))} GPU; {desc}")
        try:
            import torch
        except ImportError:
            pytest.skip("needs torch to use the GPU")
        if not torch.cuda.is_available():
            pytest.skip(f"torch cannot use the GPU; {desc}")


@pytest.fixture
def hwprofile_profile() -> Any:
    """Device 0's profile, resolved fresh for this test; skips with the reason when there is no device."""
    from hwprofile.profiles import profile, reset

    reset()
    d, desc = _device0(real=False)
    if d is None:
        pytest.skip(f"nothing to profile: {desc}; simulate one with --hwprofile-device=NAME")
    return profile(0)


@pytest.fixture
def hwprofile_simulate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Any]]:
    """``hwprofile_simulate("rtx-pro-6000")`` switches the simulated device and returns its profile."""
    from hwprofile.profiles import profile, reset

    def simulate(name: str) -> Any:
        monkeypatch.setenv(SIMULATE_ENV, name)
        reset()
        return profile(0)

    yield simulate
    reset()
