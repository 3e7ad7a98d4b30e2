"""pytest plugin for hwprofile (entry point ``pytest11``): simulated devices, architecture and GPU markers.

* ``--hwprofile-device=NAME`` (or ``HWPROFILE_DEVICE``) simulates a GPU for the session: a catalog
  name (``h200``), a generic capability (``sm_110``, ``11.0``) or a comma list. A name that is not
  known, given either way, is one usage error at start-up, not one error per test.
  ``--hwprofile-device=none`` is the leg without a device: an exported ``HWPROFILE_DEVICE`` is
  unset for the session (and given back after it).
* A malformed ``hwprofile_arch`` / ``hwprofile_gpu`` mark (no capability for ``hwprofile_arch``, a
  keyword, a non-string such as ``90``, a string that is no capability such as ``"sm_9"``) is one
  usage error at collection, on every host, listing each test and mark.
* ``@pytest.mark.hwprofile_arch("sm_120", "sm_121")`` runs a test only when device 0 has one of
  these *exact* capabilities (real or simulated), and skips it with the reason otherwise.
* ``@pytest.mark.hwprofile_gpu("sm_90")`` needs a *real* GPU (of that capability, if given) usable
  by torch; it skips cleanly without one, so CPU-only CI passes.
* fixtures: ``hwprofile_profile`` (device 0's profile; skips with the reason when there is no device),
  ``hwprofile_simulate`` (switch the simulated device inside a test; the previous state is restored)
  and ``hwprofile_strict_gpu`` (device 0's profile on the real GPU with ``HWPROFILE_STRICT=1``, for
  kernel tests: a kernel that cannot be built or loaded raises instead of falling back).
* ``rel_error(out, ref)``: the relative error of a kernel's output against a float64 reference,
  failing on a NaN (an output poisoned with NaN before the launch shows an element never written).
* ``@pytest.mark.hwprofile_per_device``: the test's outcome can depend on the session's device, so a
  CI matrix runs it once per simulated device (``-m hwprofile_per_device``) and everything else once
  (``-m "not hwprofile_per_device"``). The plugin adds the mark itself to every test that uses
  ``hwprofile_arch``, ``hwprofile_gpu`` or the ``hwprofile_profile`` fixture; a test that reads the
  device otherwise (``hwprofile.profile()`` without setting ``HWPROFILE_DEVICE`` itself) carries it
  explicitly. With the ini option ``hwprofile_guard_device = true`` every test *without* the mark runs
  with ``HWPROFILE_DEVICE`` set to a name hwprofile refuses (:data:`UNDECLARED_DEVICE`), so such a test
  that reads the device anyway fails, and its report says which mark it lacks.
* Skips the plugin decides (markers, fixtures) are reported at the test's own location, not here.

It is its own distribution, ``pytest-hwprofile``: pytest rewrites the asserts of every module of a
distribution that declares a ``pytest11`` entry point, and hwprofile's modules are library code.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the class pytest.skip.Exception is, by the name type checkers see
    from _pytest.outcomes import Skipped as _Skipped
else:
    _Skipped = pytest.skip.Exception

__all__ = ["PER_DEVICE", "UNDECLARED_DEVICE", "rel_error"]

_SAVED_ENV = pytest.StashKey[str | None]()  # HWPROFILE_DEVICE before --hwprofile-device set it
# hwprofile's control variables, spelled here (not imported) so that loading pytest imports no hwprofile:
SIMULATE_ENV = "HWPROFILE_DEVICE"  # the simulated device(s)
STRICT_ENV = "HWPROFILE_STRICT"  # stale values and kernel faults are errors, not warnings and fallbacks

#: The marker of a test whose outcome can depend on the session's device (run once per device).
PER_DEVICE = "hwprofile_per_device"
#: What a test without :data:`PER_DEVICE` sees as ``HWPROFILE_DEVICE`` under ``hwprofile_guard_device``:
#: hwprofile refuses the name (``DeviceError: unknown simulated device ...``), and so does any
#: subprocess that inherits it.
UNDECLARED_DEVICE = "read-by-a-test-not-marked-hwprofile_per_device"
#: The plugin's markers and fixtures whose use makes a test per-device: each reads device 0 of the
#: session (the simulated one, or the real GPU). ``hwprofile_simulate`` and ``hwprofile_strict_gpu``
#: are not among them: each sets (or unsets) the simulated device itself.
_DEVICE_MARKERS = ("hwprofile_arch", "hwprofile_gpu")
_DEVICE_FIXTURES = frozenset({"hwprofile_profile"})
_GUARD_INI = "hwprofile_guard_device"


class _Skip(_Skipped):
    """A skip this plugin decides: reported at the test's location (``pytest_runtest_makereport``)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hwprofile")
    group.addoption(
        "--hwprofile-device", default=None, metavar="NAME",
        help="simulate this GPU: a catalog name (h200), a capability (sm_110, 11.0), a comma list, or 'none'",
    )
    parser.addini(
        _GUARD_INI, type="bool", default=False,
        help=f"tests not marked {PER_DEVICE} see HWPROFILE_DEVICE={UNDECLARED_DEVICE} (refused), so reading the session device fails them",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hwprofile_arch(*sms): run only when device 0 has one of these exact capabilities (sm_90, 12.1...)")
    config.addinivalue_line("markers", "hwprofile_gpu(*sms): needs a real GPU usable by torch (of one of these capabilities, if given)")
    config.addinivalue_line(
        "markers",
        f"{PER_DEVICE}: the outcome can depend on the session's device (--hwprofile-device): run once per device "
        "(added automatically to tests using hwprofile_arch, hwprofile_gpu or the hwprofile_profile fixture)",
    )
    name = config.getoption("--hwprofile-device", default=None)
    if name is None:
        exported = os.environ.get(SIMULATE_ENV)
        if exported and exported != UNDECLARED_DEVICE:  # the guard's own name, inherited by a child pytest: refused at the read
            _check_device(exported, f"{SIMULATE_ENV}={exported} (exported)", "fix or unset it, or pass --hwprofile-device=none")
        return
    config.stash[_SAVED_ENV] = os.environ.get(SIMULATE_ENV)
    if name.strip().lower() == "none":  # the leg without a device: an exported simulation must not leak into it
        os.environ.pop(SIMULATE_ENV, None)
    else:
        _check_device(name, f"--hwprofile-device={name}", "")
        os.environ[SIMULATE_ENV] = name
    _reset_hwprofile()


def _check_device(name: str, what: str, fix: str) -> None:
    """One usage error at start-up for a device hwprofile refuses, instead of one error per test."""
    import hwprofile
    from hwprofile.errors import DeviceError

    try:  # through hwprofile.detect: a name an installed plugin's catalog contributes is valid too
        hwprofile.detect({SIMULATE_ENV: name})
    except DeviceError as exc:
        raise pytest.UsageError(f"{what}: {exc}" + (f"; {fix}" if fix else "")) from None


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give the process its own HWPROFILE_DEVICE back (an in-process ``pytest.main`` must not leak it)."""
    if _SAVED_ENV not in config.stash:
        return
    before = config.stash[_SAVED_ENV]
    if before is None:
        os.environ.pop(SIMULATE_ENV, None)
    else:
        os.environ[SIMULATE_ENV] = before
    _reset_hwprofile()


_CC = re.compile(r"(?:sm_?)?(\d+)\.?(\d)[af]?")


def _parse_cc(s: str) -> tuple[int, int]:
    m = _CC.fullmatch(s.strip().lower())
    if not m:
        raise pytest.UsageError(f"hwprofile marker: {s!r} is not a capability; write 'sm_90', 'sm_121' or '9.0'")
    return int(m.group(1)), int(m.group(2))


def _mark_problem(mark: pytest.Mark) -> str | None:
    """What is wrong with a ``hwprofile_arch`` / ``hwprofile_gpu`` mark's arguments, or ``None``.

    ``hwprofile_arch`` needs at least one capability (none skipped the test forever); both take
    capabilities as positional strings only (a keyword was ignored, ``90`` was an AttributeError).
    """
    shown = ", ".join([*map(repr, mark.args), *(f"{k}={v!r}" for k, v in mark.kwargs.items())])
    call = f"@pytest.mark.{mark.name}({shown})"
    example = "e.g. 'sm_90', 'sm_121' or '9.0'"
    if mark.kwargs:
        return f"{call} takes capabilities as positional strings, not keywords ({', '.join(mark.kwargs)}); {example}"
    if mark.name == "hwprofile_arch" and not mark.args:
        return f"{call} names no capability, so the test would never run; name one or more, {example}"
    for a in mark.args:
        if not isinstance(a, str):
            return f"{call}: {a!r} is not a string; write the capability as one, {example}"
        if not _CC.fullmatch(a.strip().lower()):
            return f"{call}: {a!r} is not a capability; {example}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every malformed device mark, on every host and before ``-m`` deselects: one usage error listing them.

    At setup a malformed mark was reached only where nothing skipped the test first (a GPU host).
    """
    problems = []
    for item in items:
        for name in _DEVICE_MARKERS:
            for mark in item.iter_markers(name):
                problem = _mark_problem(mark)
                if problem is not None:
                    problems.append(f"{item.nodeid}: {problem}")
    if problems:
        raise pytest.UsageError("malformed hwprofile marker(s):\n  " + "\n  ".join(dict.fromkeys(problems)))


def _device0(real: bool) -> tuple[Any, str]:
    import hwprofile

    det = hwprofile.detect({k: v for k, v in os.environ.items() if k != SIMULATE_ENV}) if real else hwprofile.detect()
    if not det.devices:
        return None, f"no device ({det.reason})"
    d = det.devices[0]
    return d, f"device 0 is {d.name} ({d.sm}{', simulated' if d.simulated else ''})"


def _real_gpu_or_skip(wanted: set[tuple[int, int]]) -> None:
    """Skip, with the reason, unless device 0 is a real GPU (of one of ``wanted``, if any) that torch can use."""
    d, desc = _device0(real=True)
    if d is None:
        raise _Skip(f"needs a real NVIDIA GPU; {desc}")
    if wanted and d.compute_capability not in wanted:
        raise _Skip(f"needs a real {', '.join(sorted(f'sm_{a}{b}' for a, b in wanted))} GPU; {desc}")
    try:
        import torch
    except ImportError:
        raise _Skip("needs torch to use the GPU") from None
    if not torch.cuda.is_available():
        raise _Skip(f"torch cannot use the GPU; {desc}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("hwprofile_arch"):
        wanted = {_parse_cc(a) for a in mark.args}
        d, desc = _device0(real=False)
        if d is None or d.compute_capability not in wanted:
            raise _Skip(f"needs {', '.join(sorted(f'sm_{a}{b}' for a, b in wanted))}; {desc}")
    for mark in item.iter_markers("hwprofile_gpu"):
        _real_gpu_or_skip({_parse_cc(a) for a in mark.args})


def _uses_the_device(item: pytest.Item) -> bool:
    """Whether ``item`` uses one of the plugin's markers or fixtures that read the session's device."""
    if any(item.get_closest_marker(m) is not None for m in _DEVICE_MARKERS):
        return True
    return not _DEVICE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark per-device every test that uses the device markers or fixtures (before ``-m`` selects)."""
    if item.get_closest_marker(PER_DEVICE) is None and _uses_the_device(item):
        item.add_marker(PER_DEVICE)


def _reset_hwprofile() -> None:
    """Forget resolved devices and profiles, when hwprofile is loaded (they were resolved for another device)."""
    if "hwprofile.profiles" in sys.modules:
        sys.modules["hwprofile.profiles"].reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Under ``hwprofile_guard_device``, run a test without the per-device mark on a refused device name."""
    if not item.config.getini(_GUARD_INI) or item.get_closest_marker(PER_DEVICE) is not None:
        return (yield)
    before = os.environ.get(SIMULATE_ENV)
    os.environ[SIMULATE_ENV] = UNDECLARED_DEVICE
    _reset_hwprofile()
    try:
        return (yield)
    finally:
        if before is None:
            os.environ.pop(SIMULATE_ENV, None)
        else:
            os.environ[SIMULATE_ENV] = before
        _reset_hwprofile()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Skips of this plugin at the test's location; a guarded test that read the device says what it lacks."""
    report = yield
    if report.skipped and call.excinfo is not None and isinstance(call.excinfo.value, _Skip):
        path, line = item.reportinfo()[:2]
        report.longrepr = (os.fspath(path), (line or 0) + 1, f"Skipped: {call.excinfo.value.msg}")
    elif report.failed and UNDECLARED_DEVICE in _report_text(report):
        report.sections.append((
            "hwprofile",
            f"This test read the session's device (HWPROFILE_DEVICE, hwprofile.profile(), hwprofile.detect()) but is not marked "
            f"{PER_DEVICE}: under {_GUARD_INI} it saw HWPROFILE_DEVICE={UNDECLARED_DEVICE}. Mark it "
            f"@pytest.mark.{PER_DEVICE} (it then runs once per simulated device), or give it its own device "
            "(monkeypatch.setenv('HWPROFILE_DEVICE', 'h200'), the hwprofile_simulate fixture, or an explicit environ).",
        ))
    return report


def _report_text(report: pytest.TestReport) -> str:
    return report.longreprtext + "".join(content for _, content in report.sections)


@pytest.fixture
def hwprofile_profile() -> Any:
    """Device 0's profile, resolved fresh for this test; skips with the reason when there is no device."""
    from hwprofile.profiles import profile, reset

    reset()
    d, desc = _device0(real=False)
    if d is None:
        raise _Skip(f"nothing to profile: {desc}; simulate one with --hwprofile-device=NAME")
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


@pytest.fixture
def hwprofile_strict_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Device 0's profile on the real GPU, resolved fresh with ``HWPROFILE_STRICT=1``, for kernel tests.

    No device is simulated (``HWPROFILE_DEVICE`` is unset for the test), and strict mode turns a
    kernel that cannot be built or loaded into an error instead of a warning and the torch fallback,
    so a test that launches kernels (``hwprofile.ops.run_kernel``) fails on them. Strict mode also
    makes a stale shipped threshold an error: the profile is the one the test's kernels run under.
    Skips with the reason without a real GPU usable by torch; the previous state is restored.
    """
    _real_gpu_or_skip(set())
    from hwprofile.profiles import profile, reset

    monkeypatch.delenv(SIMULATE_ENV, raising=False)
    monkeypatch.setenv(STRICT_ENV, "1")
    reset()
    yield profile(0)
    reset()  # the environment is restored after this (monkeypatch is torn down later): nothing resolved here survives


def rel_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64, for torch tensors; a NaN in ``out`` fails the test.

    Poison the output with NaN before the launch: an element the kernel never wrote then fails here
    rather than passing as a small error. ``ref`` is the float64 reference (``x.double() @ w.double().t()``);
    when its norm is 0 the absolute error ``||out - ref||`` is returned.
    """
    import torch

    if bool(torch.isnan(out).any()):
        pytest.fail(f"an output element was not written (NaN in {int(torch.isnan(out).sum())} of {out.numel()})")
    diff = float((out.double() - ref.double()).norm())
    norm = float(ref.double().norm())
    return diff / norm if norm else diff
