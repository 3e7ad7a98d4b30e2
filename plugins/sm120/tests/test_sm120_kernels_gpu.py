"""hwprofile-sm120's kernels on its own GPU (skipped cleanly elsewhere): pytest_hwprofile.family's checks, which
every plugin on the shared family runs. Until this has run on such a GPU the kernels are correct by construction only.
"""

from __future__ import annotations

import pytest

from pytest_hwprofile.family import FamilyGPUChecks


@pytest.mark.hwprofile_gpu("sm_120", "sm_121")
class TestSm120Kernels(FamilyGPUChecks):
    plugin, prefix = "sm120", "hwp120"
    disable = "myengine"  # the example downstream plugin of this repository, when installed beside it
