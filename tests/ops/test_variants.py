"""Kernel variants in the decision (split-K on / off), on the CPU through the fake launcher: the sweep's faster
variant per measured shape (``<op>.measured``'s ``@variant``) is what the op launches there, the nearest measured
shapes vote elsewhere, ``decide``/``explain`` name the variant and why, and a user's ``gemv.split_k`` always wins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hwprofile
from hwprofile import costmodel, ops, sweep, tuning
from hwprofile.errors import SettingError

from .test_gates import KERNEL_FASTER, FakeLauncher, env, fp8, predict, rand

torch = pytest.importorskip("torch")

@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, no_downstream: None) -> Iterator[FakeLauncher]:
    """The fake launcher on a simulated H200 (as tests/ops/test_gates.py's), recording each launch's split-K."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    ops.reset_dispatch()
    launcher = FakeLauncher()
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    monkeypatch.setattr(ops._kernel, "launch", launcher)
    yield launcher
    ops.reset_dispatch()


TABLE = "1x2048x4096=kernel@nosplit:5/9; 1x4096x4096=kernel@split:8/12; 1x8192x4096=fallback@nosplit:30/20"


def test_measured_variants_round_trip_and_bad_names_are_refused() -> None:
    parsed = tuning.parse_measured("gemv", TABLE, where="test")
    assert parsed[(1, 2048, 4096)] == tuning.Measured(True, 5.0, 9.0, "nosplit")
    assert parsed[(1, 8192, 4096)].variant == "nosplit" and not parsed[(1, 8192, 4096)].kernel
    assert tuning.format_measured(parsed) == TABLE
    assert tuning.parse_measured("gemv", "1x64x512=kernel:2/3", where="t")[(1, 64, 512)].variant is None  # the old format
    with pytest.raises(SettingError, match="kernel variant 'splitk', not one of split, nosplit"):
        tuning.parse_measured("gemv", "1x64x512=kernel@splitk:2/3", where="t")
    with pytest.raises(SettingError, match="records no kernel time"):
        tuning.parse_measured("gemv", "1x64x512=fallback@split:-/3", where="t")


def test_predict_variant_measured_here_then_the_nearest_vote() -> None:
    v = {(1, 2048, 4096): "nosplit", (1, 4096, 4096): "split", (1, 57344, 4096): "split"}
    assert costmodel.predict_variant(None, v, 1, 2048, 4096) == costmodel.VariantChoice("nosplit", 1.0, ((1, 2048, 4096),))
    near = costmodel.predict_variant(None, v, 1, 2304, 4096)  # next to 2048 (N weighs 4x): nosplit despite two split votes
    assert near.variant == "nosplit" and near.weight > 0.5 and near.neighbours[0] == (1, 2048, 4096)
    assert costmodel.predict_variant(None, v, 1, 16384, 4096).variant == "split"
    assert costmodel.predict_variant(None, {}, 1, 64, 64) == costmodel.VariantChoice(None, 0.0, ())


def test_the_op_launches_the_measured_variant_and_explains_it(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    predict(monkeypatch, "gemv", KERNEL_FASTER, measured=TABLE)
    prof = hwprofile.profile(0)
    ops.gemv(rand(1, 4096), rand(2048, 4096))
    ops.gemv(rand(1, 4096), rand(4096, 4096))
    ops.gemv(rand(1, 4096), rand(2056, 4096))  # not measured: its nearest measured shape (2048) ran faster without split-K
    assert fake.split_ks == [False, True, False]
    d = ops.decide("gemv", prof, m=1, n=2048, k=4096)
    assert d.path == "kernel" and d.reason.endswith("variant: split-K off (the faster variant measured at this shape)")
    d = ops.decide("gemv", prof, m=1, n=2056, k=4096)
    assert "variant: split-K off (100% of the weight of the nearest measured shapes (1x2048x4096))" in d.reason
    assert "variant" not in ops.decide("gemv", prof, m=1, n=8192, k=4096).reason  # the fallback: no variant to name


def test_a_users_split_k_is_never_overridden(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    predict(monkeypatch, "gemv", KERNEL_FASTER, measured=TABLE)
    env(monkeypatch, gemv_split_k="1")
    ops.gemv(rand(1, 4096), rand(2048, 4096))
    assert fake.split_ks == [None]  # the profile's split-K: the user's
    d = ops.decide("gemv", hwprofile.profile(0), m=1, n=2048, k=4096)
    assert "variant: split-K on: gemv.split_k set by the user, never overridden" in d.reason


def test_without_measured_variants_the_profile_decides(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:
    predict(monkeypatch, "fp8_gemv", KERNEL_FASTER, measured="8x2048x4096=kernel:5/9")
    ops.fp8_gemv(rand(8, 4096), fp8(2048, 4096), torch.tensor([1.0]))
    assert fake.split_ks == [None]
    assert "no measured shape names a faster variant" in ops.decide("fp8_gemv", hwprofile.profile(0), m=8, n=2048, k=4096).reason


def test_the_sweep_times_each_variant_where_the_plans_differ_and_keeps_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    prof = hwprofile.profile(0)
    timer = sweep.GpuTimer.__new__(sweep.GpuTimer)  # its variant list only: no GPU needed
    timer.prof = prof
    assert timer.variants("gemv", 1, 2048, 7168, None) == {"split": True, "nosplit": False}  # cluster split-K vs persistent
    assert timer.variants("fp8_gemv", 8, 28672, 4096, 2) == {None: None}  # 896 blocks: both plans split nothing
    p = sweep.Point(1, 2048, 7168, fallback_us=[9.0] * 3)
    p.take_variants({"split": [[5.0, 5.2], [5.1]], "nosplit": [[4.0, 4.1], [4.2]]})
    assert p.variant == "nosplit" and p.kernel == pytest.approx(4.1) and p.variant_us == {"split": 5.1, "nosplit": 4.1}
    assert p.kernel_passes == [pytest.approx(4.05), 4.2]
    d = sweep.decision_table([p], "kernel")[(1, 2048, 7168)]
    assert d == tuning.Measured(True, 4.1, 9.0, "nosplit")
    assert p.as_dict("kernel")["variant"] == "nosplit"
