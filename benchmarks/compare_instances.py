"""Is the code of every sm90 kernel instance that was measured unchanged by a source edit? (CPU, NVRTC, no GPU)

    python benchmarks/compare_instances.py [REV]        # REV: the revision whose kernels were swept (default HEAD)

The sm90 plugin's shipped thresholds record the digest of the kernel source they were swept with; an edit that
changes no dispatched code (a new template argument with a default, a new instance, a comment) may carry them to
the new digest only when that is shown. This compiles, for sm_90a, every instance the plugin at REV pre-builds or
plans for the op table's sweep grids, once from REV's sources and once from the worktree's, and compares every
per-kernel section of the two cubins (.text, .nv.info, .nv.shared, .nv.constant0, .rela.text: the machine code,
its register and barrier counts, its shared memory and its relocations) kernel by kernel; the mangled names differ
when a defaulted template argument was added, so kernels are matched by name expression. It also compares the
launches (kernel, grid, block, shared memory, PDL) planned for the sweep grids. Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "plugins/sm90/src/hwprofile_sm90/kernels/sm90_gemv.cu"

# Run in a subprocess with one tree's sources on sys.path: the instances that tree's plugin ships or plans, and
# their plan digests, for a simulated H200.
_LIST = """
import json, os, sys
os.environ["HWPROFILE_DEVICE"] = "h200"
import hwprofile
from hwprofile.optable import OPS
p = hwprofile.profile(0)
exprs = set()
plans = {}
for op, spec in p.kernels.items():
    exprs |= set(spec.instances)
    d = OPS[op]
    launches = []
    for m, n, k in d.grid:
        for split in (True, False):
            for mode in d.scale_modes:
                try:
                    la = spec.configure(m=m, n=n, k=k, split_k=split, **({"scale": mode} if d.scaled else {}))
                except ValueError as exc:
                    launches.append([m, n, k, split, mode, "refused", str(exc)])
                    continue
                exprs.add(la.name_expression)
                launches.append([m, n, k, split, mode, la.name_expression, list(la.grid), list(la.block), la.shared_bytes, la.pdl])
    plans[op] = launches
print(json.dumps({"exprs": sorted(exprs), "plans": plans}))
"""

_COMPILE = """
import pickle, sys
from pathlib import Path
from hwprofile.kernels import toolchain
tree, exprs = Path(sys.argv[1]), sys.argv[2:]
own = str(tree / "core/src/hwprofile/include")
inc = (own, *(d for d in toolchain.include_dirs() if not d.rstrip("/").endswith("hwprofile/include")))
opts = toolchain.CompileOptions("sm_90a", inc)
cubin, names, _ = toolchain.nvrtc_compile((tree / SOURCE).read_text(), "kernels/sm90_gemv.cu", opts, exprs, what="comparison")
sys.stdout.buffer.write(pickle.dumps((cubin, names)))
""".replace("SOURCE", repr(SOURCE))


def _run(tree: Path, code: str, *args: str) -> bytes:
    env = {**os.environ, "PYTHONPATH": f"{tree}/core/src{os.pathsep}{tree}/plugins/sm90/src"}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, check=True).stdout


def sections(cubin: bytes) -> dict[str, bytes]:
    """Section name -> contents of an ELF64 (little-endian) cubin; NOBITS sections as their size."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx][4]
    out = {}
    for name, typ, _flags, _addr, offset, size in hdrs:
        nm = cubin[strtab + name : cubin.index(b"\0", strtab + name)].decode()
        out[nm] = cubin[offset : offset + size] if typ != 8 else b"NOBITS %d" % size
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", nargs="?", default="HEAD")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        listed = json.loads(_run(old, _LIST))
        now = json.loads(_run(ROOT, _LIST))
        exprs = listed["exprs"]
        oc, on = pickle.loads(_run(old, _COMPILE, str(old), *exprs))
        nc, nn = pickle.loads(_run(ROOT, _COMPILE, str(ROOT), *exprs))
    os_, ns = sections(oc), sections(nc)
    bad = []
    compared = 0
    for e in exprs:
        kinds_old = sorted(k[: -len(on[e])] for k in os_ if k.endswith(on[e]))
        kinds_new = sorted(k[: -len(nn[e])] for k in ns if k.endswith(nn[e]))
        if kinds_old != kinds_new:
            bad.append(f"{e}: sections {kinds_old} -> {kinds_new}")
            continue
        for kind in kinds_old:
            compared += 1
            if os_[kind + on[e]] != ns[kind + nn[e]]:
                bad.append(f"{e}: {kind} differs")
    for op, launches in listed["plans"].items():
        changed = [f"{a[:5]}: {a[5:]} -> {b[5:]}" for a, b in zip(launches, now["plans"].get(op, []), strict=False) if a != b]
        if changed or len(launches) != len(now["plans"].get(op, [])):
            bad.append(f"{op}: the sweep grid's launches changed: {'; '.join(changed[:3]) or 'another number of shapes'}")
    print(f"{len(exprs)} instances, {compared} per-kernel sections compared against {args.rev}; {len(bad)} differences")
    for b in bad:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
