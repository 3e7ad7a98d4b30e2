"""Ship a sweep's tuned files as hwprofile-sm90's measured tables: one command after an H200 run.

    python benchmarks/ship_sm90.py benchmarks/h200/<date>-<suite>/tuned

For every op with ``tuned/<op>.toml`` and ``tuned/samples/<op>.toml`` it writes
``plugins/sm90/src/hwprofile_sm90/measured/<op>.toml``: the sweep's ``[stamp]`` as written, and as
``[thresholds]`` the per-shape table (``<op>.measured``) and the cost model (``<op>.model``) fitted
again from the samples with this hwprofile's ``costmodel.fit`` (so a sweep written before the cost
model existed ships one too). Nothing else of the file is kept: the kernel's limits are the op
table's, not a sweep's. The plugin reads every value from these files (``shipped_values``).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import tomli_w

from hwprofile import costmodel, tuning
from hwprofile.optable import OPS

DEST = Path(__file__).resolve().parents[1] / "plugins" / "sm90" / "src" / "hwprofile_sm90" / "measured"


def ship(src: Path, op: str) -> Path:
    doc = tomllib.loads((src / f"{op}.toml").read_text())
    rows = tomllib.loads((src / tuning.SAMPLES_DIR / f"{op}.toml").read_text())["measurements"]
    samples = [costmodel.Sample(r["m"], r["n"], r["k"], r["kernel_us"] if r["kernel_us"] > 0 else None, r["fallback_us"]) for r in rows]
    mkey = tuning.measured_key(op)
    thresholds = {mkey: doc["thresholds"][mkey], costmodel.model_key(op): costmodel.format_model(costmodel.fit(op, samples))}
    try:
        raw = src.resolve().relative_to(DEST.parents[4])
    except ValueError:
        raw = src
    head = (
        f"# {op}: the [stamp] and per-shape table 'hwprofile sweep {op}' wrote on the lent H200, with the cost model\n"
        f"# fitted from its samples (benchmarks/ship_sm90.py); hwprofile_sm90 ships every value from here.\n"
        f"# Raw sweep (hwprofile repository, every measurement): {raw}/{op}.toml and samples/{op}.toml\n\n"
    )
    out = DEST / f"{op}.toml"
    out.write_text(head + tomli_w.dumps({"stamp": doc["stamp"], "thresholds": thresholds}))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip().split("\n\n")[1])
        return 2
    src = Path(argv[0])
    for op in OPS:
        if (src / f"{op}.toml").is_file():
            print(f"wrote {ship(src, op)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
