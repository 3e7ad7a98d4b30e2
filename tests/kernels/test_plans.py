"""Launch plans of every architecture plugin's kernels, on the CPU (simulated devices): each plan
fits its SM, covers every output row, and names an entry point of that plugin's own source; each
source refuses the targets it was not written for. The shared skinny-GEMM planner's own rules are
here too; one plugin's particular plans are tested with that plugin (plugins/*/tests).
"""

from __future__ import annotations

import re

import pytest

import hwprofile
from hwprofile.errors import KernelCompileError
from hwprofile.kernels.skinny_gemm import MAX_K, MAX_N, PREBUILT_SHAPES, ArchTuning, kernel_specs, plan, prebuilt_instances
from hwprofile.kernels.spec import Launch
from hwprofile.optable import OPS, SKINNY_GEMM

from .spills import known_spills

SIMS = {"h200": "hwp90", "gb300": "hwp100", "rtx-pro-6000": "hwp120", "dgx-spark": "hwp120"}
ROUTER = [(m, n, k) for m in range(1, 17) for n in (1, 100, 256, 384, 4096) for k in (16, 7168)]


def rows_per_block(expr: str) -> tuple[int, bool]:
    """Weight rows one block (or one row group, for persistent kernels) covers, and whether the grid is persistent."""
    args = [a.strip() for a in expr[expr.index("<") + 1 : -1].split(",")]
    name = expr[: expr.index("<")]
    if name.endswith("_router"):
        return 8 * int(args[2]), False
    if name.endswith("_skinny_mma"):
        return 8 * int(args[4]), False
    if name.endswith("_gemv_simt"):
        return int(args[3]) * int(args[4]), False
    if name == "hwp90_gemv":
        return int(args[1]) * int(args[2]), True
    raise AssertionError(f"unknown kernel {expr}")


def check_fits(launch: Launch, n: int, smem_limit: int, sm_count: int) -> None:
    assert launch.shared_bytes <= smem_limit
    assert launch.grid[1] in (1, 2, 4, 8) and launch.grid[2] == 1  # portable cluster of grid.y blocks
    assert launch.block[0] % 32 == 0 and launch.block[0] <= 1024 and launch.block[1:] == (1, 1)
    rows, persistent = rows_per_block(launch.name_expression)
    groups = -(-n // rows)
    if persistent:
        assert 1 <= launch.grid[0] <= min(groups, 2 * sm_count)  # the block loop covers the remaining groups
    else:
        assert launch.grid[0] == groups  # every row covered, no empty block


@pytest.mark.parametrize("sim", list(SIMS))
def test_launch_plans_fit_the_sm_and_name_the_plugins_entry_points(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    p = hwprofile.profile(0)
    attrs = p.device.attributes()
    smem, sms = attrs.max_shared_memory_per_block_optin, attrs.sm_count
    prefix = SIMS[sim]
    for op in ("router_gemm", "linear_bf16_fp32"):
        for m, n, k in ROUTER:
            for split in (True, False):
                la = p.kernels[op].configure(m=m, n=n, k=k, split_k=split)
                check_fits(la, n, smem, sms)
                assert la.name_expression.startswith(prefix + "_")
                e = la.name_expression
                assert e.startswith("hwp90_router<") if prefix == "hwp90" else e.startswith(prefix + "_skinny_mma<false, float,")
    for op, scales, ms in (("gemv", (0,), (1,)), ("fp8_gemv", (1, 2), (1, 2, 8, 9, 16))):
        for n in (64, 2048, 3168, 57344, 152064):
            for k in (512, 7168, p["gemv.max_k"], 16384):
                for split in (True, False):
                    for sc in scales:
                        for m in ms:
                            la = p.kernels[op].configure(m=m, n=n, k=k, split_k=split, **({"scale": sc} if op == "fp8_gemv" else {}))
                            check_fits(la, n, smem, sms)
                            assert la.name_expression.startswith(prefix + "_")
                            if m > 1:  # the FP8 tensor-core kernel: every token of the M tile in one weight read
                                mt = "1" if m <= 8 else "2"
                                assert la.name_expression.startswith(f"{prefix}_skinny_mma<true, __nv_bfloat16, {mt}, ")
    for spec in (s for s in p.kernels.values() if p.plugin is not None and s.plugin == p.plugin.name):  # the plugin's own
        assert all(e.startswith(prefix + "_") for e in spec.instances), spec.op


def test_plan_streams_x_in_chunks_past_the_whole_slice_budget() -> None:
    """A block's x slice is staged whole up to ArchTuning.simt_x_whole_max (every shape the H200 measured)
    and streamed through a chunk buffer past it, whatever the split: K no longer has a shared-memory limit."""
    t = ArchTuning(sm_count=48, max_shared_bytes=99 * 1024)
    whole = plan(t, m=1, n=65536, k=16384, fp8=False, out="bf16", scale=0, split_k=False)  # 32 KB of x: whole
    assert whole.shared_bytes == 32 * 1024 and whole.name_expression.endswith(", 4, 0>")  # no XCHUNK argument
    for k in (16392, 65536, 1 << 20):
        for split in (True, False):
            la = plan(t, m=1, n=65536, k=k, fp8=False, out="bf16", scale=0, split_k=split)
            assert la.shared_bytes == 16 * 1024 and la.name_expression.endswith(", 4, 0, 512>"), (k, split)
    f8 = plan(t, m=1, n=4096, k=32768, fp8=True, out="bf16", scale=2, split_k=True)  # 48 SMs: 512 groups, no split
    assert f8.grid == (512, 1, 1) and f8.shared_bytes == 16 * 1024 and f8.name_expression.endswith(", 2, 2, 256>")
    small = plan(t, m=1, n=64, k=32768, fp8=True, out="bf16", scale=1, split_k=True)  # split in 2: 32 KB each, whole
    assert small.grid == (8, 2, 1) and small.shared_bytes == 32 * 1024 and small.name_expression.endswith(", 2, 1>")


@pytest.mark.parametrize("fp8", [False, True])
def test_chunks_hold_whole_batches(fp8: bool) -> None:
    """The kernel's static_assert (XCHUNK a multiple of 32 * U) holds for every chunk the plan writes."""
    for unroll in (1, 2, 4, 8):
        for chunk in (16 * 1024, 24 * 1024, 40000, 64 * 1024):
            t = ArchTuning(sm_count=132, max_shared_bytes=227 * 1024, simt_unroll=unroll, fp8_unroll=unroll, simt_x_chunk=chunk)
            la = plan(t, m=1, n=8192, k=32768, fp8=fp8, out="bf16", scale=1 if fp8 else 0, split_k=False)
            xchunk = int(la.name_expression[:-1].split(",")[-1])
            assert xchunk % (32 * unroll) == 0 and 0 < 2 * xchunk * (32 if fp8 else 16) <= chunk == t.simt_x_chunk  # two buffers
            assert la.shared_bytes == 2 * xchunk * (32 if fp8 else 16)
    with pytest.raises(ValueError, match="holds no two chunks"):
        plan(ArchTuning(sm_count=132, max_shared_bytes=227 * 1024, simt_x_chunk=2048), m=1, n=8, k=65536, fp8=fp8, out="bf16",
             scale=1 if fp8 else 0, split_k=False)


def test_plan_refuses_what_no_kernel_takes_naming_the_limit() -> None:
    t = ArchTuning(sm_count=132, max_shared_bytes=227 * 1024)
    cases = [
        (dict(m=0, n=64, k=512, fp8=False, out="float"), "1 <= M <= 16"),
        (dict(m=17, n=64, k=512, fp8=False, out="float"), "1 <= M <= 16"),
        (dict(m=2, n=64, k=512, fp8=False, out="bf16"), "takes M = 1, got M=2"),
        (dict(m=17, n=64, k=512, fp8=True, out="bf16"), "FP8 GEMV kernel takes 1 <= M <= 16, got M=17"),
        (dict(m=1, n=0, k=512, fp8=True, out="bf16"), "1 <= N <="),
        (dict(m=1, n=MAX_N + 1, k=512, fp8=False, out="bf16"), f"N <= {MAX_N}"),
        (dict(m=1, n=64, k=MAX_K + 16, fp8=True, out="bf16"), f"K <= {MAX_K}"),
        (dict(m=1, n=64, k=8, fp8=True, out="bf16"), "16 <= K"),
        (dict(m=1, n=64, k=2888, fp8=True, out="bf16"), "multiple of 16"),
        (dict(m=3, n=64, k=2884, fp8=False, out="float"), "multiple of 8"),
    ]
    for kw, why in cases:
        with pytest.raises(ValueError, match=re.escape(why)):
            plan(t, scale=0, split_k=True, **kw)  # type: ignore[arg-type]
    tiny = ArchTuning(sm_count=132, max_shared_bytes=12 * 1024)  # a device reporting less than one chunk
    with pytest.raises(ValueError, match="bytes of shared memory per block"):
        plan(tiny, m=1, n=8192, k=32768, fp8=False, out="bf16", scale=0, split_k=False)
    # the split-K reduction's static buffer counts: exactly the x slice fits, the slice plus the buffer does not
    edge = ArchTuning(sm_count=132, max_shared_bytes=32 * 1024)
    assert plan(edge, m=1, n=64, k=32768, fp8=False, out="bf16", scale=0, split_k=False).shared_bytes == 16 * 1024
    with pytest.raises(ValueError, match=r"reduction \(32 bytes\)"):
        plan(edge.replace(max_shared_bytes=16 * 1024 + 31), m=1, n=64, k=65536, fp8=False, out="bf16", scale=0, split_k=True)


def test_prebuilt_instances_cover_every_scale_mode_and_split_choice() -> None:
    seen: list[dict[str, object]] = []

    def configure(**kw: object) -> Launch:
        seen.append(kw)
        return Launch(f"k<{kw.get('scale', '-')}, {kw['split_k']}>", (1, 1, 1), (32, 1, 1))

    assert prebuilt_instances("fp8_gemv", configure, ((1, 64, 512),)) == ("k<1, False>", "k<1, True>", "k<2, False>", "k<2, True>")
    seen.clear()
    assert prebuilt_instances("gemv", configure) == ("k<-, False>", "k<-, True>")  # unscaled: no scale= passed
    assert len(seen) == 2 * len(PREBUILT_SHAPES["gemv"]) and all("scale" not in kw for kw in seen)
    assert set(PREBUILT_SHAPES) == {op for op, d in OPS.items() if d.family == SKINNY_GEMM}  # declared, not inferred from prebuilt


def test_family_specs_prebuild_what_they_plan() -> None:
    t = ArchTuning(sm_count=148, max_shared_bytes=227 * 1024, prefix="hwpx")
    specs = kernel_specs("pkg", "kernels/x.cu", t)
    assert [s.op for s in specs] == list(PREBUILT_SHAPES)
    for s in specs:
        assert s.instances == prebuilt_instances(s.op, s.configure) and all(e.startswith("hwpx_") for e in s.instances)


@pytest.mark.parametrize(("sim", "foreign"), [("h200", "sm_100a"), ("gb300", "sm_90a"), ("rtx-pro-6000", "sm_100a")])
def test_each_source_refuses_foreign_targets(sim: str, foreign: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.bindings")
    from hwprofile.kernels import toolchain

    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    spec = hwprofile.profile(0).kernels["gemv"]
    with pytest.raises(KernelCompileError, match=re.escape("kernels are built for")):
        opts = toolchain.CompileOptions(foreign, toolchain.include_dirs())
        toolchain.nvrtc_compile(spec.read_source(), spec.source, opts, [spec.instances[0]], what="guard check")


@pytest.mark.parametrize(
    ("sim", "expr", "why"),
    [
        ("rtx-pro-6000", "hwp120_gemv_simt<false, __nv_bfloat16, 1, 4, 2, 16, 4, 0>", "portable cluster size"),
        ("gb300", "hwp100_skinny_mma<false, float, 1, 8, 16, 1, 4, 0>", "static shared memory of the reduction"),
    ],
)
def test_shared_entry_points_refuse_instances_past_the_sms_limits(sim: str, expr: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """hwprofile/skinny_entry.cuh's static_asserts hold against each plugin's own Limits."""
    pytest.importorskip("cuda.bindings")
    from hwprofile.kernels import toolchain

    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    spec = prof.kernels["gemv"]
    assert prof.target is not None
    with pytest.raises(KernelCompileError, match=re.escape(why)):
        opts = toolchain.CompileOptions(prof.target, toolchain.include_dirs())
        toolchain.nvrtc_compile(spec.read_source(), spec.source, opts, [expr], what="limit check")


# --- the served-model shape classes (issue 21, item 3) on every target, planned for the device in hand

TARGET_SIMS = {"h200": "sm_90a", "b200": "sm_100a", "gb300": "sm_103a", "rtx-pro-6000": "sm_120a", "rtx-5090": "sm_120a",
               "dgx-spark": "sm_121a"}
LONG_K = (2880, 8192, 14336, 16384, 25600, 28672, 32768)
ROUTER_N = (8, 16, 32, 128, 160, 256, 384, 512)
ROUTER_K = (2048, 2880, 4096, 5120, 6144, 7168)


def widest_vocab() -> int:
    from hwprofile import models

    return max(m.vocab for m in models.load().values())


def new_shape_launches(p: hwprofile.Profile) -> dict[str, set[str]]:
    """Every launch the profile plans for the new shape classes, checked to fit; the name expressions per op."""
    attrs = p.device.attributes()
    smem, sms = attrs.max_shared_memory_per_block_optin, attrs.sm_count
    assert smem is not None and sms is not None
    exprs: dict[str, set[str]] = {op: set() for op in OPS}
    vocab = widest_vocab()
    for op in ("gemv", "fp8_gemv"):
        for n in (64, 2056, 8192, 28672, vocab):
            for k in LONG_K:
                for split in (True, False):
                    for sc in OPS[op].scale_modes:
                        la = p.kernels[op].configure(m=1, n=n, k=k, split_k=split, **({"scale": sc} if OPS[op].scaled else {}))
                        check_fits(la, n, smem, sms)
                        exprs[op].add(la.name_expression)
    for op, ns, ks in (("router_gemm", ROUTER_N, ROUTER_K), ("linear_bf16_fp32", (160, 4096), (2880, 8192, 14336, 28672))):
        for m in range(1, 17):
            for n in ns:
                for k in ks:
                    for split in (True, False):
                        la = p.kernels[op].configure(m=m, n=n, k=k, split_k=split)
                        check_fits(la, n, smem, sms)
                        exprs[op].add(la.name_expression)
    return exprs


@pytest.mark.parametrize("sim", list(TARGET_SIMS))
def test_new_shape_classes_plan_on_every_target(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    p = hwprofile.profile(0)
    exprs = new_shape_launches(p)
    assert any(e.endswith(", 256>") for e in exprs["fp8_gemv"])  # some FP8 long K streams x in chunks
    if sim != "h200":  # sm90's long-K bf16 GEMV at large N is its persistent kernel (two copies of x fit 227 KB)
        assert any(e.endswith(", 512>") for e in exprs["gemv"])


def test_widest_vocabulary_is_within_the_default_bounds() -> None:
    vocab = widest_vocab()
    assert vocab == 202048  # Llama-4 (models.toml); the GPU tests' WIDEST_VOCAB
    for op in ("gemv", "fp8_gemv"):
        decl = {s[0]: s for s in OPS[op].settings}
        assert decl[f"{op}.max_n"][2] >= vocab and decl[f"{op}.max_k"][2] >= max(LONG_K)
        assert 2880 % decl[f"{op}.k_multiple"][2] == 0  # gpt-oss's hidden size passes the K gate


@pytest.mark.parametrize("sim", list(TARGET_SIMS))
def test_new_instances_compile_without_spills(sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every instance the new shape classes plan, through NVRTC for the target (CI fails on any spill, .ci/run)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from hwprofile.kernels import _pipeline as jit

    monkeypatch.setenv("HWPROFILE_DEVICE", sim)
    hwprofile.reset()
    p = hwprofile.profile(0)
    assert p.target == TARGET_SIMS[sim]
    known = known_spills(jit.nvrtc_version())  # what .ci/known-spills.txt accepts for this NVRTC (none for 13.5)
    for op, exprs in new_shape_launches(p).items():
        compiled = jit.compile_spec(p.kernels[op], p.target, tuple(sorted(exprs)))
        assert compiled.cubin[:4] == b"\x7fELF" and set(exprs) <= set(compiled.lowered), op
        allowed = known.get((p.target, op), 0)
        assert (compiled.spill_bytes or 0) <= allowed, f"{op} spills {compiled.spill_bytes} bytes on {p.target} (accepted: {allowed})"


@pytest.mark.parametrize(("real", "reference"), [("gb300", "b300"), ("rtx-5090", "rtx-pro-6000")])
def test_plans_and_their_digest_follow_the_devices_sm_count(real: str, reference: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GB300 (152 SMs) is planned as itself, not as a B300 (148); an RTX 5090 (170) not as an RTX PRO 6000 (188)."""
    from hwprofile import tuning

    seen = {}
    for sim in (real, reference):
        monkeypatch.setenv("HWPROFILE_DEVICE", sim)
        hwprofile.reset()
        p = hwprofile.profile(0)
        sms = p.device.attributes().sm_count
        assert sms is not None
        # the plan's SM count is the device's: N = 1064 (133 groups of 8) splits K in 2 exactly below 3 groups a SM,
        # and the router's cluster widens while groups x split stay under 1.4 (sm100/120) or 2 (sm90) blocks a SM
        la = p.kernels["gemv"].configure(m=1, n=8 * (3 * sms - 1), k=4096, split_k=True)
        assert la.grid[1] == 2
        assert p.kernels["gemv"].configure(m=1, n=8 * 3 * sms, k=4096, split_k=True).grid[1] == 1
        seen[sim] = (sms, {op: tuning.plan_digest(op, p.kernels[op]) for op in PREBUILT_SHAPES})  # the family's GEMM ops
    assert seen[real][0] != seen[reference][0]
    assert all(seen[real][1][op] != seen[reference][1][op] for op in PREBUILT_SHAPES)


def test_b300_and_gb300_routers_differ_where_the_sm_count_decides() -> None:
    """The router's cluster split: N = 424 (53 groups) x 8 = 424 blocks is under 1.4 x 152 x 2 ... = the rule's edge."""
    b300 = ArchTuning(sm_count=148, max_shared_bytes=227 * 1024, prefix="hwp100")
    gb300 = b300.replace(sm_count=152)
    kw = dict(m=4, n=424, k=7168, fp8=False, out="float", scale=0, split_k=True)
    assert plan(b300, **kw).grid == (53, 4, 1)  # type: ignore[arg-type]  # 212 blocks >= 1.4 x 148 = 207.2
    assert plan(gb300, **kw).grid == (53, 8, 1)  # type: ignore[arg-type]  # 212 < 1.4 x 152 = 212.8: one more split


def test_a_real_gpu_is_planned_from_its_driver_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not simulated: the SM count and shared memory come from the driver (an H100 PCIe: 114 SMs), never the catalog."""
    import hwprofile_sm90.planning as sm90
    from hwprofile import device as dev

    asked: list[int] = []

    def driver(index: int) -> dev.DriverAttributes:
        asked.append(index)
        return dev.DriverAttributes(sm_count=114, max_shared_memory_per_block_optin=200 * 1024, l2_cache_bytes=50 << 20)

    monkeypatch.setattr(dev, "_driver_attributes", driver)
    real = dev.DeviceInfo(index=3, name="NVIDIA H100 PCIe", compute_capability=(9, 0))
    specs = {s.op: s for s in sm90.kernel_specs("hwprofile_sm90", real)}
    assert asked == []  # resolving a profile does not initialise the driver: the first plan does
    assert specs["gemv"].instances == {s.op: s for s in sm90.kernel_specs("hwprofile_sm90")}["gemv"].instances  # the H200's
    gemv = specs["gemv"]
    assert gemv.configure(m=1, n=8 * (3 * 114 - 1), k=4096, split_k=True).grid[1] == 2  # 341 groups < 3 x 114
    assert gemv.configure(m=1, n=8 * 3 * 114, k=4096, split_k=True).grid[1] == 1
    assert gemv.configure(m=1, n=57344, k=4096, split_k=True).grid == (228, 1, 1)  # persistent: 2 blocks x 114 SMs
    # 200 KB a block: hwp90_gemv's two copies of x fit up to K = 51200, the chunked kernel takes longer K
    assert gemv.configure(m=1, n=57344, k=51200, split_k=True).name_expression.startswith("hwp90_gemv<")
    assert gemv.configure(m=1, n=57344, k=51208, split_k=True).name_expression.endswith(", 512>")
    assert set(asked) == {3}
    assert "sm_count=114" in gemv.configure.plan_basis  # type: ignore[attr-defined]  # what the plan digest records
    # unknown attributes (no cuda-python): the reference card's
    monkeypatch.setattr(dev, "_driver_attributes", lambda index: dev.DriverAttributes())
    ref = {s.op: s for s in sm90.kernel_specs("hwprofile_sm90", real)}
    assert ref["gemv"].configure(m=1, n=57344, k=4096, split_k=True).grid == (264, 1, 1)


def test_fp8_tensor_core_plan_needs_a_scale_and_bf16_output() -> None:
    t = ArchTuning(sm_count=148, max_shared_bytes=227 * 1024, prefix="hwp100")
    la = plan(t, m=16, n=4096, k=4096, fp8=True, out="bf16", scale=1, split_k=False)
    assert la.name_expression == "hwp100_skinny_mma<true, __nv_bfloat16, 2, 8, 4, 1, 2, 1>" and la.grid == (128, 1, 1)
    with pytest.raises(ValueError, match="needs a scale"):
        plan(t, m=4, n=4096, k=4096, fp8=True, out="bf16", scale=0, split_k=False)
    with pytest.raises(ValueError, match="writes bf16, not float"):
        plan(t, m=4, n=4096, k=4096, fp8=True, out="float", scale=1, split_k=False)
