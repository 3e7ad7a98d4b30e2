"""The gate kind of the op table (``moe_gate``) is swept, stamped, tuned, reported, agreed and explained like every op.

On a simulated H200 with a fake timer (sweep's Timer protocol): nothing here needs a GPU. The GPU side (the fused
kernel timed against its torch path) is ``sweep.GpuTimer._gate_pass``, run by ``hwprofile sweep moe_gate``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import costmodel, retune, sweep, tuning
from hwprofile.cli import main
from hwprofile.distributed._summary import entries_digest, profile_entries
from hwprofile.ops import decide, decide_moe_gate
from hwprofile.optable import MOE_GATE, TABLE
from hwprofile.sweep import Point

OP = MOE_GATE.name


class GateTimer:
    """The fused gate 5 us + N/200 up to 384 experts (40 us past), against torch's step at 25 us; records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, int]] = []

    def measure(self, op: str, m: int, n: int, k: int) -> Point:
        self.calls.append((op, m, n, k))
        kern = 5.0 + n / 200 if n <= 384 else 40.0
        return Point(m, n, k, [kern] * 5, [25.0] * 5, [kern, kern], [25.0, 25.0])


def swept(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    prof = hwprofile.profile(0)
    doc = sweep.run(prof, OP, sweep.default_grid(OP), GateTimer(), box=sweep.box_grid(OP))
    path = tmp_path / f"{OP}.toml"
    sweep.write(doc, path)
    return doc, path


def test_the_gates_grid_is_every_served_router_and_the_catalogs_router_shapes() -> None:
    grid = set(sweep.default_grid(OP))
    assert {(m, r.n, r.k) for r in MOE_GATE.routers for m in range(1, 17)} <= grid
    assert set(sweep.model_grid("router_gemm")) <= grid  # the gate's GEMM is the router's: every catalog MoE model's router
    assert grid == set(sweep.box_grid(OP)) | set(sweep.model_grid(OP))


def test_a_sweep_of_the_gate_is_stamped_and_applies_like_every_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc, path = swept(tmp_path)
    st = doc["stamp"]
    assert st["op"] == OP and st["fallback"]["function"] == MOE_GATE.fallback and st["plan"] and st["kernel"]
    assert set(doc["thresholds"]) == {f"{OP}.model", f"{OP}.measured"}
    model = costmodel.parse(OP, doc["thresholds"][f"{OP}.model"], where="test")
    assert model.samples == len(doc["measurements"]) and model.kernel is not None
    table = tuning.parse_measured(OP, doc["thresholds"][f"{OP}.measured"], where="test")
    assert table[(4, 256, 7168)].kernel and not table[(4, 512, 2048)].kernel  # the kernel lost past 384 experts

    monkeypatch.setenv("HWPROFILE_TUNED_FILE", str(path))
    hwprofile.reset()
    prof = hwprofile.profile(0)
    for key in (f"{OP}.model", f"{OP}.measured"):
        r = prof.explain(key)
        assert r.winner.kind == "tuned" and isinstance(r.winner.stamp, tuning.Stamp), key
        assert not tuning.assess(prof, r.winner.stamp).stale
    d = decide_moe_gate(prof, m=4, n=256, k=7168, n_group=8, topk_group=4, top_k=8)
    assert (d.path, d.basis, d.kernel_us, d.fallback_us) == ("kernel", "measured", 6.28, 25.0)
    d = decide(OP, prof, m=4, n=512, k=2048)
    assert (d.path, d.basis) == ("fallback", "measured") and "moe_gate.measured" in d.reason
    d = decide_moe_gate(prof, m=3, n=320, k=4096, top_k=8)  # a router nobody measured: the fitted model, its neighbours named
    assert d.basis == "model" and "fitted on NVIDIA H200" in d.reason and "nearest measured shapes" in d.reason


def test_a_kernel_win_past_the_gates_limits_is_recorded_as_the_fallback() -> None:
    class Always(GateTimer):
        def measure(self, op: str, m: int, n: int, k: int) -> Point:
            return Point(m, n, k, [1.0] * 5, [25.0] * 5, [1.0, 1.0], [25.0, 25.0])

    grid = [(4, 256, 7168), (17, 256, 7168), (1, 1024, 2048), (2, 96, 2048)]
    doc = sweep.run(hwprofile.profile(0), OP, grid, Always(), box=[])
    table = tuning.parse_measured(OP, doc["thresholds"][f"{OP}.measured"], where="test")
    assert {s: d.kernel for s, d in table.items()} == {(4, 256, 7168): True, (17, 256, 7168): False, (1, 1024, 2048): False,
                                                       (2, 96, 2048): True}
    notes = " ".join(doc["sweep"]["notes"])
    assert "17x256x7168" in notes and "1x1024x2048" in notes and "takes M <= 16" in notes


def test_a_gate_file_stamped_against_another_fallback_is_stale_and_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    import tomli_w

    _, path = swept(tmp_path)
    doc = tomllib.loads(path.read_text())
    doc["stamp"]["fallback"]["function"] = "torch.topk on bf16 logits (an older gate)"
    path.write_text(tomli_w.dumps(doc))
    monkeypatch.setenv("HWPROFILE_TUNED_FILE", str(path))
    hwprofile.reset()
    r = hwprofile.profile(0).explain(f"{OP}.measured")
    assert r.winner.kind != "tuned" and any(layer.stale for layer in r.chain if layer.kind == "tuned")


def test_the_report_the_held_out_rows_and_the_plot_cover_the_gate(tmp_path: Path) -> None:
    doc, _ = swept(tmp_path)
    rows = sweep.report(hwprofile.profile(0), doc)
    assert len(rows) == len(doc["measurements"])
    assert all(r.regret == 1.0 for r in rows)  # the result's own table decides every measured shape
    assert {r.basis for r in rows} == {"measured", "limit"} or {r.basis for r in rows} == {"measured"}
    held = sweep.cross_validate(doc)
    assert held and not {(h.m, h.n, h.k) for h in held} & set(MOE_GATE.grid)  # the box edges (served routers) stay in every fit
    assert all(h.regret >= 1.0 for h in held)
    pytest.importorskip("matplotlib")
    out = tmp_path / "gate-regret.png"
    sweep.plot_regret({OP: rows, f"{OP} held out": held}, out)
    assert out.read_bytes()[:4] == b"\x89PNG"
    sweep.plot(doc, tmp_path / "gate.png")  # latency against M per served router (the sweep's --plot)
    assert (tmp_path / "gate.png").read_bytes()[:4] == b"\x89PNG"


def test_tune_finds_the_gate_unmeasured_and_refits_its_model() -> None:
    prof = hwprofile.profile(0)
    found = {f.op: f for f in retune.findings(prof)}
    assert found[OP].status == "unmeasured"  # sm90 states the bandwidth rule for the fused gate, measured nowhere
    assert retune.decided_keys(OP) == (f"{OP}.model", f"{OP}.measured")  # what a sweep writes
    plan = retune.plan(prof, ops=[OP])
    assert set(plan.grids) == {OP} and set(plan.grids[OP]) == set(sweep.default_grid(OP)) and plan.estimate_s() > 0
    timer = GateTimer()
    result = hwprofile.tune(0, ops=[OP], timer=timer)
    assert {c[0] for c in timer.calls} == {OP} and len(timer.calls) == len(plan.grids[OP])
    assert [p.name for p in result.written] == [f"{OP}.toml"]
    after = hwprofile.profile(0)
    model = after.explain(f"{OP}.model")
    assert model.winner.kind == "tuned" and costmodel.parse(OP, model.value, where="test").samples == len(timer.calls)
    assert {f.op: f.status for f in retune.findings(after)}[OP] == "fresh"


def test_the_agreement_compares_the_gates_values_and_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    prof = hwprofile.profile(0)
    entries = profile_entries(prof)
    assert {f"setting.{OP}.model", f"setting.{OP}.measured", f"setting.{OP}.max_tokens", f"kernel.{OP}"} <= set(entries)
    assert {f"setting.{op}.model" for op in TABLE} <= set(entries)  # every op's cost model is compared across ranks
    monkeypatch.setenv("HWPROFILE_MOE_GATE_MEASURED", "4x256x7168=fallback:9/8")  # one rank measured otherwise
    hwprofile.reset()
    other = hwprofile.profile(0)
    assert entries_digest(profile_entries(other), other.fingerprint) != entries_digest(entries, prof.fingerprint)


def test_the_commands_take_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", OP]) == 2  # accepted as an op; refused only because the device is simulated
    assert "is simulated" in capsys.readouterr().err
    assert main(["tune", "--dry-run", "--ops", OP]) == 0
    assert OP in capsys.readouterr().out


def test_the_gates_kernel_seam_refuses_what_it_cannot_run() -> None:
    torch = pytest.importorskip("torch")
    from hwprofile import ops
    from hwprofile.ops import _gate

    ops.register()
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="2-D CUDA tensor"):
        _gate.run_kernel(x, w, None, top_k=2, n_group=1, topk_group=1, renormalize=True, scaling=1.0, scoring="sigmoid")
    with pytest.raises(ValueError, match="top_k"):
        _gate.run_kernel(x, w, None, top_k=0, n_group=1, topk_group=1, renormalize=True, scaling=1.0, scoring="sigmoid")


@pytest.mark.parametrize("router", [r.name for r in MOE_GATE.routers])
def test_the_gpu_timer_times_the_fused_kernel_and_the_torch_path_with_the_served_routers_selection(
    router: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GpuTimer's gate pass on the CPU: its graphs replaced by calling each copy once, the kernel seam by a recorder."""
    torch = pytest.importorskip("torch")
    from hwprofile import ops
    from hwprofile.ops import _gate

    ops.register()
    r = next(x for x in MOE_GATE.routers if x.name == router)
    seen: list[tuple[str, Any]] = []

    def kernel(x: Any, w: Any, bias: Any, **sel: Any) -> Any:
        seen.append(("kernel", (tuple(x.shape), tuple(w.shape), bias is None, sel)))
        if sel["top_k"] > 8:
            raise ValueError("the planner refuses it")  # the timer goes on with the fallback alone
        return None

    def fallback(x: Any, w: Any, bias: Any, *sel: Any) -> Any:
        seen.append(("fallback", (tuple(x.shape), tuple(w.shape), bias is None, sel)))

    monkeypatch.setattr(_gate, "run_kernel", kernel)
    monkeypatch.setattr(_gate, "fallback", fallback)
    timer = sweep.GpuTimer(hwprofile.profile(0), reps=3, rotate_bytes=1)  # two weight copies
    timer.dev = torch.device("cpu")
    monkeypatch.setattr(timer, "_graph", lambda fn, calls: [float(fn(i) is None) for i in range(calls)])
    m = 3
    assert MOE_GATE.router_for(r.n, r.k) is r
    point = timer.measure(OP, m, r.n, r.k)
    sel = {"top_k": r.top_k, "n_group": r.n_group, "topk_group": r.topk_group, "renormalize": r.renormalize, "scaling": r.scaling,
           "scoring": r.scoring}
    kernels = [a for what, a in seen if what == "kernel"]
    fallbacks = [a for what, a in seen if what == "fallback"]
    assert all(a == ((m, r.k), (r.n, r.k), r.scoring != "sigmoid", sel) for a in kernels)
    assert all(a == ((m, r.k), (r.n, r.k), r.scoring != "sigmoid",
                     (r.n_group, r.topk_group, r.top_k, r.renormalize, r.scaling, r.scoring)) for a in fallbacks)
    passes = inspect.signature(sweep.GpuTimer.measure).parameters["passes"].default  # independent passes, fresh weights each
    assert len(fallbacks) == passes * 2  # each pass: two copies
    if r.top_k > 8:
        assert len(kernels) == passes and not point.kernel_us  # refused once per pass: no kernel time
    else:
        assert len(kernels) == passes * 3 and point.kernel_us  # a check call per pass, then each copy
