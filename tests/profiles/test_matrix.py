"""Per-architecture legs: these tests read the session's device (``--hwprofile-device``), so each CI
leg exercises that architecture's selection, settings, env defaults, dispatch and kernel build."""

from __future__ import annotations

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.kernels import _pipeline as jit
from hwprofile.optable import OPS

pytestmark = pytest.mark.hwprofile_per_device  # the legs: every test here reads the session's device


@pytest.fixture
def prof() -> hwprofile.Profile:
    det = hwprofile.detect()
    if not det.devices:
        pytest.skip(f"no device in this leg ({det.reason})")
    return hwprofile.profile(0)


@pytest.mark.hwprofile_arch("sm_90")
def test_hopper_leg(prof: hwprofile.Profile) -> None:
    assert prof.plugin.name == "sm90" and prof.target == "sm_90a"
    assert prof.env_defaults["TORCH_CUDA_ARCH_LIST"].value == "9.0a"
    assert prof.explain("myengine.fused_shared_experts").value is False
    assert ops.decide("gemv", prof, m=1, n=4096, k=4096).path == "kernel"


@pytest.mark.hwprofile_arch("sm_100", "sm_103")
def test_blackwell_datacenter_leg(prof: hwprofile.Profile) -> None:
    cc = prof.device.compute_capability
    assert prof.plugin.name == "sm100" and prof.target == f"sm_{cc[0]}{cc[1]}a"
    assert prof.env_defaults["TORCH_CUDA_ARCH_LIST"].value == f"{cc[0]}.{cc[1]}a"
    assert prof.explain("myengine.fused_shared_experts").value is False


@pytest.mark.hwprofile_arch("sm_120", "sm_121")
def test_blackwell_workstation_leg(prof: hwprofile.Profile) -> None:
    cc = prof.device.compute_capability
    assert prof.plugin.name == "sm120" and prof.target == f"sm_{cc[0]}{cc[1]}a"
    fused = prof.explain("myengine.fused_shared_experts")
    assert fused.value is True and fused.winner.source.startswith("myengine-hwprofile") and not fused.setting.bit_identical
    assert prof.device.attributes().max_shared_memory_per_block_optin == 99 * 1024


@pytest.mark.hwprofile_arch("sm_89", "sm_80")
def test_no_plugin_leg(prof: hwprofile.Profile) -> None:
    assert prof.plugin is None and prof.target is None and prof.kernels == {}
    for op in OPS:
        assert ops.decide(op, prof, m=1, n=2048, k=7168).path == "fallback"


def test_leg_profile_is_consistent(prof: hwprofile.Profile) -> None:
    d = prof.as_dict()
    assert d["device"]["compute_capability"] == list(prof.device.compute_capability)
    if prof.plugin is not None:
        assert prof.device.compute_capability in prof.plugin.arch.targets
        assert set(OPS) <= set(prof.kernels)  # every shipped plugin serves every op of the table
        assert set(prof.kernels) - set(OPS) <= {"moe_gate"}  # and beside them only moe_gate's selection (ops._gate)


def test_leg_kernels_compile_for_its_target(prof: hwprofile.Profile) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    if prof.target is None:
        pytest.skip("no architecture plugin in this leg")
    for op, spec in prof.kernels.items():
        if op not in OPS:  # moe_gate's selection: its own shape and compile tests (plugins/sm90/tests/test_sm90_moe_gate.py)
            continue
        for m, n, k in [(1, 2048, 7168), (16, 256, 7168)] if op in ("router_gemm", "linear_bf16_fp32") else [(1, 4096, 4096)]:
            launch = spec.configure(m=m, n=n, k=k, split_k=True, **({"scale": 2} if op == "fp8_gemv" else {}))
            compiled = jit.compile_spec(spec, prof.target, (launch.name_expression,))
            assert compiled.cubin[:4] == b"\x7fELF", op
            assert compiled.spill_bytes in (None, 0), f"{op} spills on {prof.target}"


def test_leg_ops_honour_contracts() -> None:
    torch = pytest.importorskip("torch")
    h = torch.randn(6, 256).bfloat16()
    w = torch.randn(64, 256).bfloat16()
    assert ops.router_gemm(h, w).dtype == torch.float32
    assert ops.linear_bf16_fp32(h, w).dtype == torch.float32
    assert ops.gemv(h[:1], w).dtype == torch.bfloat16
    assert ops.fp8_gemv(h[:1], w.to(torch.float8_e4m3fn), torch.ones(64)).dtype == torch.bfloat16
