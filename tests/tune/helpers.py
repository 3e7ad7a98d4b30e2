"""A fake timer (sweep's Timer protocol) and stale tuned files, shared by the tune tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hwprofile_sm90
from hwprofile import tuning
from hwprofile.optable import GATES, OPS, TABLE
from hwprofile.sweep import Point


class FakeTimer:
    """Kernel 4 us while M <= ``wins_to`` (else 9 us) against a 7 us fallback, at every N and K; records each call."""

    def __init__(self, wins_to: int = 10, fail_at: tuple[str, int, int, int] | None = None, fail_after: int | None = None) -> None:
        self.wins_to, self.fail_at, self.fail_after = wins_to, fail_at, fail_after
        self.calls: list[tuple[str, int, int, int]] = []

    def measure(self, op: str, m: int, n: int, k: int) -> Point:
        self.calls.append((op, m, n, k))
        if (op, m, n, k) == self.fail_at or (self.fail_after is not None and len(self.calls) > self.fail_after):
            raise RuntimeError(f"fake kernel failure at {op} M={m} N={n} K={k}")
        kern = 4.0 if m <= self.wins_to else 9.0
        return Point(m, n, k, [kern] * 5, [7.0] * 5, [kern, kern], [7.0, 7.0])


#: The ops sm90 ships predicted (the bandwidth rule, no sweep: hwprofile_sm90.predicted() and the gate kind):
#: unmeasured on an H200, so tune measures them by default.
PREDICTED = [op for op in TABLE if op in hwprofile_sm90.predicted() or op in GATES]
#: The ops sm90 ships swept on an H200 (fresh on one), in the op table's order.
SWEPT = [op for op in OPS if op not in hwprofile_sm90.predicted()]


def shipped(key: str) -> Any:
    """``key`` as sm90 ships it in ``measured/OP.toml`` (what applies on an H200 while no tuned file does)."""
    _, thresholds = tuning.read_tuned(Path(hwprofile_sm90.__file__).parent / "measured" / f"{key.split('.')[0]}.toml")
    return thresholds[key]


#: The FakeTimer the stale files' values were "measured" with: a crossover no tune test uses, so their values differ.
STALE_WINS_TO = 3


def stale_tuned_file(prof: Any, op: str = "router_gemm", name: str | None = None, directory: Path | None = None,
                     **changes: Any) -> Path:
    """A tuned file for ``op`` stamped against what runs for ``prof``, except ``changes`` (default: another fallback function).

    Its values are what a sweep of the op table's grid writes (``<op>.model`` and ``<op>.measured``) with a
    ``FakeTimer(wins_to=STALE_WINS_TO)``: what :func:`hwprofile.retune.findings` weighs, unlike the kernel's limits.
    """
    import tomli_w

    from hwprofile import sweep

    spec = prof.kernels[op]
    st = tuning.current(op, prof.device, prof.plugin.name, prof.plugin.version or "", spec.source_digest(), "2026-11-30",
                        plan=tuning.plan_digest(op, spec)).as_dict()
    if not changes:
        changes = {"fallback_function": "torch.matmul (an older fallback)"}
    for k, v in changes.items():
        if k.startswith("fallback_"):
            st["fallback"][k[len("fallback_"):]] = v
        else:
            st[k] = v
    d = directory if directory is not None else tuning.tuned_dir(prof.device, __import__("os").environ)
    d.mkdir(parents=True, exist_ok=True)
    p = d / (name or f"{op}.toml")
    thresholds = sweep.run(prof, op, sweep.box_grid(op), FakeTimer(wins_to=STALE_WINS_TO))["thresholds"]
    assert set(thresholds) == {f"{op}.model", tuning.measured_key(op)}, thresholds  # what findings() weighs
    p.write_text(tomli_w.dumps({"stamp": st, "thresholds": thresholds}))
    return p
