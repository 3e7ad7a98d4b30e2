"""Serving start-up on the GPU (issue 23 item 5): no compiler on the serving path, first calls safe in capture.

Every measurement is a fresh process (``tests/serving/scenarios.py``), so nothing of CUDA, cuBLAS or
hwprofile is warm but what the scenario says:

* ``first profile() + first op call`` (gemv 1x4096x4096, a kernel shape on sm90), wall seconds, with
  1. **no cache** (an empty ``HWPROFILE_CACHE_DIR``: NVRTC compiles the instance),
  2. **a warm local cache** (the same directory again),
  3. **the prebuilt layer** as a directory (``hwprofile compile --arch sm_90a --warm ... --output L``, then
     ``HWPROFILE_CACHE_DIR=L:<empty>`` with ``HWPROFILE_NO_COMPILE=1``),
  4. **the prebuilt layer as an installed wheel** (``--package``, ``pip wheel --no-build-isolation``,
     ``pip install --no-index --target``: local files only), found through its entry point, no configuration;
* **capture of a warmed engine step** with a never-seen shape of each path (``warmed_capture``);
* **a first call in capture without warm-up** (``unwarmed_capture``): the clear error, never a broken capture.

Each first-call case runs ROUNDS times (fresh directories for the cold case); medians and every sample are
written to serving.json in $OUT (or ./out); exit 1 when a case failed or broke a capture. About 150 s of
GPU time: its own device call. Usage, from the repository root with hwprofile importable:
    OUT=dir python3 benchmarks/serving_h200.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
WARM = "gemv:1x4096x4096"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(extra)
    return env


def scenario(name: str, **env: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-m", "tests.serving.scenarios", name], capture_output=True, text=True, env=_env(**env),
                       cwd=ROOT, timeout=600)
    if p.returncode != 0:
        return {"failed": p.returncode, "stderr": p.stderr[-4000:]}
    out: dict[str, Any] = json.loads(p.stdout.splitlines()[-1])
    out["capture_broken"] = "cudaErrorStreamCaptureInvalidated" in p.stderr or "CUBLAS_STATUS" in p.stderr
    return out


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=_env(**env), cwd=ROOT, timeout=600)


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [s for s in samples if "failed" not in s]
    out: dict[str, Any] = {"samples": samples}
    if ok:
        out["profile_s"] = statistics.median(s["profile_s"] for s in ok)
        out["first_call_s"] = statistics.median(s["first_call_s"] for s in ok)
        out["total_s"] = statistics.median(s["profile_s"] + s["first_call_s"] for s in ok)
        out["kernels"] = ok[-1]["stats"].get("kernels")
    return out


def main() -> int:
    global ROUNDS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"fresh processes per first-call case (default {ROUNDS})")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    ROUNDS = args.rounds
    gpu = subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                         capture_output=True, text=True, timeout=120)
    if gpu.returncode != 0:  # every scenario would fail, after minutes of fresh processes
        print("serving_h200.py: needs a CUDA GPU and torch (torch.cuda.is_available() is not True)", file=sys.stderr)
        return 2
    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hwp-serving-"))
    results: dict[str, Any] = {}
    try:
        cold, warm = [], []
        for i in range(ROUNDS):
            cache = work / f"cache-{i}"
            cold.append(scenario("first_call", HWPROFILE_CACHE_DIR=str(cache)))
            warm.append(scenario("first_call", HWPROFILE_CACHE_DIR=str(cache), HWPROFILE_NO_COMPILE="1"))
        results["no_cache"], results["warm_local_cache"] = summary(cold), summary(warm)

        layer, project = work / "layer", work / "hwprofile-sm90-cubins"
        built = run([sys.executable, "-m", "hwprofile.cli", "compile", "--arch", "sm_90a", "--warm", WARM, "--output", str(layer),
                     "--package", str(project), "--package-name", "hwprofile-sm90-cubins"], HWPROFILE_CACHE_DIR=str(work / "build-cache"))
        results["layer_build"] = {"rc": built.returncode, "stdout": built.stdout[-2000:], "stderr": built.stderr[-2000:]}
        results["prebuilt_layer_dir"] = summary([
            scenario("first_call", HWPROFILE_CACHE_DIR=os.pathsep.join([str(layer), str(work / f"empty-{i}")]), HWPROFILE_NO_COMPILE="1")
            for i in range(ROUNDS)
        ])
        pip = [sys.executable, "-m", "pip"]
        wheel = run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(project)])
        wheels = sorted((work / "dist").glob("*.whl")) if wheel.returncode == 0 else []
        site = work / "site"
        if wheels and run([*pip, "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                           str(wheels[0])]).returncode == 0:
            path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(site)) if p)
            results["prebuilt_layer_wheel"] = summary([
                scenario("first_call", HWPROFILE_CACHE_DIR=str(work / f"empty-w{i}"), HWPROFILE_NO_COMPILE="1", PYTHONPATH=path)
                for i in range(ROUNDS)
            ])
        else:
            results["prebuilt_layer_wheel"] = {"skipped": f"pip wheel/install failed: {wheel.stderr[-1000:]}"}

        results["warmed_capture"] = scenario("warmed_capture", HWPROFILE_CACHE_DIR=str(work / "capture-cache"))
        results["unwarmed_capture"] = scenario("unwarmed_capture", HWPROFILE_CACHE_DIR=str(work / "capture-cache-2"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out_dir / "serving.json").write_text(json.dumps(results, indent=2))
    for name in ("no_cache", "warm_local_cache", "prebuilt_layer_dir", "prebuilt_layer_wheel"):
        r = results.get(name, {})
        if "total_s" in r:
            times = f"profile {r['profile_s']:.3f}s  first call {r['first_call_s']:.3f}s  total {r['total_s']:.3f}s"
            print(f"{name:22s} {times}  {r['kernels']}")
        else:
            print(f"{name:22s} {r.get('skipped') or 'FAILED: ' + json.dumps(r)[:400]}")
    wc, uc = results["warmed_capture"], results["unwarmed_capture"]
    print(f"warmed capture: errors {wc.get('rel_errors')}, broken={wc.get('capture_broken')}, {wc.get('failed', '')}")
    print(f"unwarmed capture: error {uc.get('error', '')[:160]!r}, broken={uc.get('capture_broken')}, after {uc.get('rel_error_after')}")
    failed = [name for name, r in results.items() if isinstance(r, dict) and ("failed" in r or r.get("capture_broken")
              or any("failed" in x for x in r.get("samples", ())))]
    named = f": {', '.join(failed)}" if failed else ""
    print(f"{'PASS' if not failed else 'FAIL'}: {len(failed)} case(s) failed or broke a capture{named}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
