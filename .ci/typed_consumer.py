"""A user of every wheel, type-checked by .ci/run's types leg with mypy --strict against the installed wheels.

Without a distribution's py.typed, mypy refuses the import ("installed, but missing library stubs or py.typed
marker"): this is what py.typed promises, checked where a user sees it.
"""

import pytest

import hwprofile
import hwprofile_sm90
import hwprofile_sm100
import hwprofile_sm120
import myengine_hwprofile
from hwprofile.plugin import ArchSpec, DeviceInfo, simulated_device
from pytest_hwprofile import rel_error
from pytest_hwprofile.family import FamilyPlanChecks


def capability(d: DeviceInfo) -> tuple[int, int]:
    return d.compute_capability


def arch() -> ArchSpec:
    return hwprofile_sm90.hwprofile_arch()


def names() -> list[str]:
    return [hwprofile_sm90.NAME, hwprofile_sm100.NAME, hwprofile_sm120.NAME, myengine_hwprofile.__name__]


def fingerprint() -> str:
    return hwprofile.profile(0).fingerprint


def close(out: object, ref: object) -> bool:
    return rel_error(out, ref) < 1e-3


def cc() -> tuple[int, int]:
    return capability(simulated_device((9, 0)))


@pytest.fixture
def device() -> DeviceInfo:
    return simulated_device((9, 0))


class TestPlans(FamilyPlanChecks):
    plugin, prefix = "sm100", "hwp100"
    devices = ("b200",)
