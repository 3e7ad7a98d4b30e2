"""The checks every plugin on hwprofile's shared skinny-GEMM family needs, written once: hwprofile-sm100 and
hwprofile-sm120 run them, and ``hwprofile new-plugin --family`` writes a plugin whose tests do.

Subclass them in the plugin's tests (the subclass's name starts with ``Test``; these do not, so they are not
collected themselves) and say which plugin, entry-point prefix and simulated devices::

    class TestSm120Plans(FamilyPlanChecks):
        plugin, prefix = "sm120", "hwp120"
        devices = ("rtx-pro-6000", "dgx-spark")  # simulated devices it serves, by catalog name
        same_capability = ("rtx-5090", "rtx-pro-6000")  # one capability, two SM counts (or None)


    @pytest.mark.hwprofile_gpu("sm_120", "sm_121")
    class TestSm120Kernels(FamilyGPUChecks):
        plugin, prefix = "sm120", "hwp120"

The plan checks run anywhere (each sets its simulated device itself: no GPU, no session device); the GPU
checks need a GPU of the plugin and skip elsewhere. Imports hwprofile: this module is imported by a plugin's
tests, never when pytest loads ``pytest_hwprofile``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

import hwprofile
from hwprofile.optable import GATES
from hwprofile.plugin import OPS, PREBUILT_SHAPES

from . import SIMULATE_ENV, STRICT_ENV, rel_error

__all__ = ["FamilyGPUChecks", "FamilyPlanChecks"]

CONFIG_DIR_ENV = "HWPROFILE_CONFIG_DIR"  # where tuned files and self-test verdicts are read and written
DISABLE_ENV = "HWPROFILE_DISABLE_PLUGINS"  # plugins left out by name
#: x of more than this many bytes a block is streamed through shared memory in chunks (hwprofile/gemv.cuh)
_WHOLE_X_BYTES = 32 * 1024


def _profile(monkeypatch: pytest.MonkeyPatch, device: str) -> hwprofile.Profile:
    monkeypatch.setenv(SIMULATE_ENV, device)
    hwprofile.reset()
    return hwprofile.profile(0)


class FamilyPlanChecks:
    """The plugin's plans on simulated devices: it is selected, plans every op of the family and the fused gate
    under its prefix, streams a long x through shared memory, plans for each device's own SM count, and proposes
    its own target as ``TORCH_CUDA_ARCH_LIST``."""

    plugin: ClassVar[str]  #: the plugin's name (its entry point)
    prefix: ClassVar[str]  #: its ``ArchTuning.prefix``: every instance is ``<prefix>_...``
    devices: ClassVar[tuple[str, ...]]  #: simulated devices it serves, by catalog name
    #: two catalog devices of one capability with different SM counts, or None where the plugin has no such pair
    same_capability: ClassVar[tuple[str, str] | None] = None

    def test_selected_with_every_op_of_the_family(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for device in self.devices:
            prof = _profile(monkeypatch, device)
            assert prof.plugin is not None and prof.plugin.name == self.plugin, f"{device}: plugin {prof.plugin}"
            assert {*PREBUILT_SHAPES, *GATES} <= set(prof.kernels), f"{device}: kernels for {sorted(prof.kernels)}"
            for op, spec in ((o, s) for o, s in prof.kernels.items() if s.plugin == self.plugin):  # its own (a downstream may add)
                bad = [i for i in spec.instances if not i.startswith(f"{self.prefix}_")]
                assert spec.instances and not bad, f"{device} {op}: instances outside the prefix {self.prefix}: {bad[:3]}"

    def test_long_k_streams_x_through_shared_memory(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Up to 32 KB of x a block is staged whole; past that it is streamed in chunks, so no K is too long."""
        for device in self.devices:
            prof = _profile(monkeypatch, device)
            smem = prof.device.attributes().max_shared_memory_per_block_optin
            for op in (o for o in PREBUILT_SHAPES if OPS[o].threshold == "box"):  # the GEMVs
                spec, kw = prof.kernels[op], ({"scale": OPS[op].scale_modes[-1]} if OPS[op].scaled else {})
                whole = spec.configure(m=1, n=8192, k=_WHOLE_X_BYTES // 2, split_k=False, **kw)
                assert whole.shared_bytes == _WHOLE_X_BYTES, (device, op, whole)
                for k in (40960, 65536, 131072):
                    la = spec.configure(m=1, n=8192, k=k, split_k=False, **kw)
                    assert la.shared_bytes < _WHOLE_X_BYTES and (smem is None or la.shared_bytes <= smem), (device, op, k, la)
                    assert la.name_expression.startswith(f"{self.prefix}_gemv_simt<"), la.name_expression

    def test_each_device_plans_for_its_own_sm_count(self, monkeypatch: pytest.MonkeyPatch) -> None:
        if self.same_capability is None:
            pytest.skip(f"{self.plugin}: no two catalog devices of one capability")
        from hwprofile import tuning

        profs = [_profile(monkeypatch, d) for d in self.same_capability]
        assert profs[0].device.compute_capability == profs[1].device.compute_capability
        assert profs[0].device.attributes().sm_count != profs[1].device.attributes().sm_count
        a, b = ({op: tuning.plan_digest(op, p.kernels[op]) for op in PREBUILT_SHAPES} for p in profs)  # the GEMM ops' digests
        assert any(a[op] != b[op] for op in a), f"{self.same_capability}: the same plan digests on different SM counts"

    def test_env_defaults_name_the_devices_target(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for device in self.devices:
            prof = _profile(monkeypatch, device)
            assert prof.target is not None
            digits = prof.target.removeprefix("sm_").rstrip("af")
            want = f"{digits[:-1]}.{digits[-1]}{prof.target.removeprefix('sm_')[len(digits):]}"
            d = prof.env_defaults["TORCH_CUDA_ARCH_LIST"]
            assert d.value == want and prof.target in d.reason, (device, d)
            assert prof.env_defaults["CUDA_MODULE_LOADING"].value == "LAZY"


class FamilyGPUChecks:
    """The plugin's kernels on its own GPU (mark the subclass ``hwprofile_gpu(<its capabilities>)``): every instance
    the profile dispatches passes the self-test, and the planner's edges (tails in N and K, every cluster split,
    the largest K that fits shared memory) match a float64 reference."""

    plugin: ClassVar[str]
    prefix: ClassVar[str]
    #: plugins to leave out of the profile (a downstream plugin installed beside it changes what is dispatched)
    disable: ClassVar[str] = ""

    @pytest.fixture
    def prof(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
        """Device 0's profile on the real GPU, strict (a kernel that cannot be built or loaded raises), a fresh config dir."""
        from hwprofile import ops

        monkeypatch.delenv(SIMULATE_ENV, raising=False)
        monkeypatch.setenv(STRICT_ENV, "1")
        monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
        if self.disable:
            monkeypatch.setenv(DISABLE_ENV, self.disable)
        hwprofile.reset()
        ops.reset_dispatch()
        p = hwprofile.profile(0)
        assert p.plugin is not None and p.plugin.name == self.plugin
        return p

    def test_every_dispatched_instance_passes_the_selftest(self, prof: Any) -> None:
        from hwprofile import selftest

        report = selftest.run(prof, force=True, apply=False)
        assert report.verdicts and report.ok, [(v.instance, v.shape, v.error) for v in report.verdicts if not v.ok]
        assert all(v.instance.startswith(f"{self.prefix}_") for v in report.verdicts)

    @pytest.mark.parametrize("split", [True, False])
    @pytest.mark.parametrize(("m", "n", "k"), [(1, 100, 7176), (9, 4104, 7168), (16, 8, 64), (3, 65536, 512)])
    def test_skinny_mma_edges(self, prof: Any, m: int, n: int, k: int, split: bool) -> None:
        import torch

        from hwprofile import ops

        x, w = torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16()
        out = torch.full((m, n), float("nan"), device="cuda")
        assert ops.run_kernel("linear_bf16_fp32", out, x, w, split_k=split)
        torch.cuda.synchronize()
        assert rel_error(out, x.double() @ w.double().t()) < 1e-4

    @pytest.mark.parametrize("split", [True, False])
    @pytest.mark.parametrize(("n", "k"), [(64, 512), (2056, 17408), (57344, 7168), (12344, 1024)])
    def test_gemv_edges(self, prof: Any, n: int, k: int, split: bool) -> None:
        import torch

        from hwprofile import ops

        x, w = torch.randn(1, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16()
        out = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert ops.run_kernel("gemv", out, x, w, split_k=split)
        torch.cuda.synchronize()
        assert rel_error(out, x.double() @ w.double().t()) < 1e-2
