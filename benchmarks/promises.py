"""The promise suite: what the README promises on a GPU, each checked in a fresh process.

    python3 benchmarks/promises.py            every check, one fresh process each; exit 1 if any fails
    python3 benchmarks/promises.py NAME...    only these (names below)

Run first whenever a GPU is lent (``benchmarks/run_h200.sh promises`` writes promises.log and promises.json).
Each check prints one JSON line ``{"check", "ok", "detail", ...numbers}`` as its last line.

  fork        profile() loads no CUDA driver (libcuda), leaves no thread; a forked child then uses CUDA and an op
  threads     16 threads making the first profile() at once get one profile, no error
  capture     warmed capture on both paths (kernel, fallback) replays what eager computes; an unwarmed first call
              inside a capture is a clear NotWarmedError / NotVerifiedError and the stream stays usable
  precision   every op on every path (kernel and fallback shapes, every scale mode) against float64; the gate's
              ids against the torch selection
  verify      verification on first use: real instances verified once (a verdict file), a kernel instance made
              wrong on purpose (launched with K halved) is disabled with one warning and the op stays right
  cold        4 processes with one empty kernel cache and config dir at once: every result right, one verdict file
  firstprof   first profile() in a fresh process: at most 200 ms (median of 5), and libcuda never loaded
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

CHECKS: dict[str, Callable[[], dict[str, Any]]] = {}
FIRST_PROFILE_MS = 200.0


def check(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def driver_loaded() -> bool:
    """Whether this process loaded the CUDA driver library (libcuda): profile() must not (NVML is libnvidia-ml).

    Read from /proc/self/maps, so the probe itself touches no CUDA (a driver call before a fork is what it guards).
    """
    with open("/proc/self/maps") as f:
        return "libcuda.so" in f.read()


def rel(a: Any, b: Any) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@check
def check_fork() -> dict[str, Any]:
    import threading
    import warnings

    import hwprofile

    t0 = time.perf_counter()
    prof = hwprofile.profile(0)
    ms = (time.perf_counter() - t0) * 1e3
    started, threads = driver_loaded(), threading.active_count()
    if started or threads != 1:
        return {"ok": False, "detail": f"after profile(): libcuda loaded={started}, threads={threads}", "profile_ms": ms}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # "This process is multi-threaded, use of fork() may lead to deadlocks"
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            from hwprofile import ops

            x = torch.randn(4, 7168, device="cuda").to(torch.bfloat16)
            w = torch.randn(256, 7168, device="cuda").to(torch.bfloat16)
            y = ops.router_gemm(x, w)
            torch.cuda.synchronize()
            code = 0 if rel(y, x.double() @ w.double().t()) < 1e-4 else 3
        except BaseException as exc:  # noqa: BLE001 - the child reports through its exit code
            print(f"child: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    return {"ok": rc == 0, "detail": f"child exit {rc} (0: CUDA and router_gemm right in the forked child)", "profile_ms": ms,
            "plugin": prof.plugin.name if prof.plugin else None}


@check
def check_threads() -> dict[str, Any]:
    import threading

    import hwprofile

    got: list[Any] = []
    errors: list[str] = []
    start = threading.Barrier(16)

    def go() -> None:
        start.wait()
        try:
            got.append(hwprofile.profile(0))
        except BaseException as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}")

    ts = [threading.Thread(target=go) for _ in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    one = len({id(p) for p in got}) == 1
    return {"ok": not errors and len(got) == 16 and one, "detail": f"{len(got)} profiles, one object: {one}, errors: {errors[:2]}"}


def kernel_shapes(op: str) -> list[tuple[int, int, int]]:
    """The shapes of ``op``'s grid and pre-built list that route to its kernel on this device (by decide())."""
    import hwprofile
    from hwprofile import ops
    from hwprofile.optable import OPS

    prof = hwprofile.profile(0)
    d = OPS[op]
    cands = dict.fromkeys((m, n, k) for m, n, k in (*d.grid, *d.prebuilt) if m and n and k and n * k <= (64 << 20))
    return [s for s in cands if ops.decide(op, prof, m=s[0], n=s[1], k=s[2]).path == "kernel"]


def _shapes(op: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A kernel-path and a fallback-path shape of ``op`` on this device (by decide()), or raises."""
    kern = kernel_shapes(op)
    if not kern:
        raise RuntimeError(f"{op}: no shape of its grid routes to the kernel on this device")
    _, n, k = kern[0]
    return kern[0], (256, n, k)  # above every kernel's M: the fallback


def _operands(op: str, m: int, n: int, k: int, mode: int = 0) -> tuple[Any, Any, Any]:
    import torch

    from hwprofile.optable import OPS, TENSOR_SCALE

    d = OPS[op]
    x = torch.randn(m, k, device="cuda").to(getattr(torch, d.x_dtype))
    w = (torch.randn(n, k, device="cuda") * (16 if d.scaled else 1)).to(getattr(torch, d.w_dtype))
    s = None
    if d.scaled:
        s = torch.rand(1 if mode == TENSOR_SCALE else n, device="cuda") + 0.5
    return x, w, s


def _reference(x: Any, w: Any, s: Any) -> Any:
    wd = w.double() * (s.double().reshape(-1, 1) if s is not None else 1)
    return x.double() @ wd.t()


def _call(op: str, x: Any, w: Any, s: Any) -> Any:
    from hwprofile import ops

    fn = getattr(ops, op)
    return fn(x, w) if s is None else fn(x, w, s)


@check
def check_capture() -> dict[str, Any]:
    import torch

    from hwprofile import ops
    from hwprofile.errors import NotWarmedError

    out: dict[str, Any] = {}
    problems = []
    for op in ("router_gemm", "gemv"):
        kern, fb = _shapes(op)
        # unwarmed: the first call of this shape inside a capture must be a clear error, the stream usable after
        x, w, s = _operands(op, *kern)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                _call(op, x, w, s)
            problems.append(f"{op} {kern}: unwarmed first call inside a capture did not raise")
        except NotWarmedError as exc:
            out[f"{op}_unwarmed"] = type(exc).__name__
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{op} {kern}: unwarmed capture raised {type(exc).__name__}: {exc}")
        torch.cuda.synchronize()
        ops.warmup(0, {op: [kern, fb]})
        for path, shape in (("kernel", kern), ("fallback", fb)):
            x, w, s = _operands(op, *shape)
            eager = _call(op, x, w, s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                res = _call(op, x, w, s)
            g.replay()
            torch.cuda.synchronize()
            if not torch.equal(res, eager):
                problems.append(f"{op} {path} {shape}: the replay differs from eager")
            out[f"{op}_{path}"] = list(shape)
    return {"ok": not problems, "detail": "; ".join(problems) or "warmed: replay == eager on both paths; unwarmed: clear error", **out}


@check
def check_precision() -> dict[str, Any]:
    import torch

    from hwprofile import ops
    from hwprofile.optable import OPS, TENSOR_SCALE

    tol = {"float32": 1e-4, "bfloat16": 1e-2}
    rows = []
    problems = []
    for op, d in OPS.items():
        kern, fb = _shapes(op)
        for path, shape in (("kernel", kern), ("fallback", fb)):
            for mode in d.scale_modes if d.scaled else (0,):
                x, w, s = _operands(op, *shape, mode)
                before = dict(ops._dispatch.table(0).prof.stats.counts.get(op, {}))
                y = _call(op, x, w, s)
                torch.cuda.synchronize()
                after = ops._dispatch.table(0).prof.stats.counts.get(op, {})
                took = "kernel" if after.get("kernel", 0) > before.get("kernel", 0) else "fallback"
                e = rel(y, _reference(x, w, s))
                ok = e <= tol[d.out_dtype] and str(y.dtype).endswith(d.out_dtype) and took == path
                rows.append({"op": op, "path": path, "took": took, "shape": list(shape), "scale": mode, "rel": e, "ok": ok})
                if not ok:
                    problems.append(f"{op} {path} {shape} scale {'tensor' if mode == TENSOR_SCALE else mode}: took {took}, rel {e:.2e}")
    # the gate: ids against torch's selection of the same fp32 logits, weights against float64
    from hwprofile.ops import _gate

    for n, k, groups, tg in ((256, 7168, 8, 4), (384, 7168, 1, 1)):
        for m in (1, 4, 16, 64):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
            b = torch.randn(n, device="cuda") * 0.1
            ids, wts = ops.moe_gate(x, w, b, top_k=8, n_group=groups, topk_group=tg, renormalize=True, routed_scaling_factor=2.5)
            logits = (x.double() @ w.double().t()).float()
            rid, rw = _gate.select_torch(logits, b, groups, tg, 8, True, 2.5, "sigmoid")
            choice = logits.sigmoid() + b
            # equal ids, or a swap between near-tied experts (fp32 logits summed in another order)
            same = torch.equal(ids, rid) or bool(((choice.gather(1, ids) - choice.gather(1, rid)).abs() < 1e-5).all())
            e = rel(wts, rw)
            rows.append({"op": "moe_gate", "shape": [m, n, k], "ids_equal": same, "rel": e, "ok": same and e < 1e-4})
            if not (same and e < 1e-4):
                problems.append(f"moe_gate {m}x{n}x{k}: ids equal {same}, weights rel {e:.2e}")
    return {"ok": not problems, "detail": "; ".join(problems[:6]) or f"{len(rows)} op/path/scale rows within tolerance", "rows": rows}


@check
def check_verify() -> dict[str, Any]:
    import warnings

    import torch

    import hwprofile
    from hwprofile import _verdicts, ops
    from hwprofile.kernels import launch as klaunch

    prof = hwprofile.profile(0)
    kern, _ = _shapes("gemv")
    x, w, _s = _operands("gemv", *kern)
    t0 = time.perf_counter()
    y = ops.gemv(x, w)  # first use: verified, then served
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    path = _verdicts.path_for(prof)
    have = _verdicts.read(path)
    verified = [v for v in have.values() if v.op == "gemv" and v.ok]
    t0 = time.perf_counter()
    for _ in range(3):
        ops._verify.check("router_gemm", (4, 256, 7168), 0, torch.device("cuda", 0), lambda o, a, b, c: o.copy_(a.float() @ b.float().t()))
    torch.cuda.synchronize()
    check_ms = (time.perf_counter() - t0) * 1e3 / 3
    # a real kernel instance launched wrong on purpose: K halved (it reads half of every row)
    real = klaunch.LoadedKernel.launch

    def wrong(self: Any, plan: Any, stream: int, args: Any) -> None:
        a = list(args)
        a[-1] = a[-1] // 2
        real(self, plan, stream, tuple(a))

    klaunch.LoadedKernel.launch = wrong  # type: ignore[method-assign]
    other = [sh for sh in kernel_shapes("gemv") if sh[1:] != kern[1:]]
    if not other:
        return {"ok": False, "detail": "gemv: one (N, K) only routes to the kernel here: nothing to make fail on purpose"}
    x2, w2, _ = _operands("gemv", *other[0])
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        y2 = ops.gemv(x2, w2)
        y3 = ops.gemv(x2, w2)
    torch.cuda.synchronize()
    klaunch.LoadedKernel.launch = real  # type: ignore[method-assign]
    msgs = [str(g.message) for g in got if "failed verification" in str(g.message)]
    right = rel(y2, _reference(x2, w2, None)) < 1e-2 and rel(y3, _reference(x2, w2, None)) < 1e-2
    failed = [v for v in _verdicts.read(path).values() if v.op == "gemv" and not v.ok]
    ok = bool(verified) and len(msgs) == 1 and right and bool(failed) and rel(y, _reference(x, w, None)) < 1e-2
    return {"ok": ok, "detail": f"verified {len(verified)}, warnings {len(msgs)}, op right {right}, failed verdicts {len(failed)}",
            "first_call_ms": first_ms, "check_ms_router_4x256x7168": check_ms, "warning": msgs[:1]}


COLD_CHILD = r"""
import json, sys, torch, hwprofile
from hwprofile import ops
x = torch.randn(4, 7168, device="cuda").to(torch.bfloat16)
w = torch.randn(256, 7168, device="cuda").to(torch.bfloat16)
y = ops.router_gemm(x, w)
e = float((y.double() - x.double() @ w.double().t()).norm() / (x.double() @ w.double().t()).norm())
print(json.dumps({"rel": e, "counts": hwprofile.profile(0).stats.counts.get("router_gemm")}))
"""


@check
def check_cold() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HWPROFILE_CACHE_DIR": os.path.join(tmp, "cache"), "HWPROFILE_CONFIG_DIR": os.path.join(tmp, "config")}
        procs = [subprocess.Popen([sys.executable, "-c", COLD_CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
        outs = [p.communicate(timeout=240) for p in procs]
        results = []
        for p, (o, e) in zip(procs, outs, strict=True):
            try:
                results.append(json.loads(o.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                results.append({"error": e[-400:], "rc": p.returncode})
        files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(tmp, "config")) for f in fs if f.endswith(".json")]
        readable = all(isinstance(json.load(open(f)), dict) for f in files)
    ok = all(r.get("rel", 1) < 1e-4 and (r.get("counts") or {}).get("kernel") == 1 for r in results) and readable and len(files) == 1
    return {"ok": ok, "detail": f"{len(results)} processes: {results}; verdict files {len(files)} readable {readable}"}


FIRST_CHILD = r"""
import time
t0 = time.perf_counter()
import hwprofile
p = hwprofile.profile(0)
ms = (time.perf_counter() - t0) * 1e3
print(ms, int("libcuda.so" in open("/proc/self/maps").read()))
"""


@check
def check_firstprof() -> dict[str, Any]:
    times, inits = [], []
    for _ in range(5):
        o = subprocess.run([sys.executable, "-c", FIRST_CHILD], capture_output=True, text=True, timeout=120, check=True).stdout.split()
        times.append(float(o[-2]))
        inits.append(int(o[-1]))
    times.sort()
    med = times[len(times) // 2]
    detail = f"median {med:.0f} ms (target {FIRST_PROFILE_MS:.0f}), libcuda loaded in {sum(inits)} of 5"
    return {"ok": med <= FIRST_PROFILE_MS and not any(inits), "detail": detail, "first_profile_ms": times}


def run_all(names: list[str]) -> int:
    results = []
    root = tempfile.mkdtemp(prefix="hwprofile-promises-")
    for name in names:
        t0 = time.perf_counter()
        # each check its own config dir (verdicts: the verify check leaves a failed one on purpose); the kernel cache shared
        env = {**os.environ, "HWPROFILE_CONFIG_DIR": os.path.join(root, name)}
        p = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, timeout=300, env=env)
        secs = time.perf_counter() - t0
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            r = {"ok": False, "detail": f"exit {p.returncode}: {p.stderr.strip()[-800:]}"}
        r = {"check": name, **r, "seconds": round(secs, 1)}
        if p.returncode != 0 and r.get("ok"):
            r["ok"], r["detail"] = False, f"exit {p.returncode} after reporting ok: {p.stderr.strip()[-400:]}"
        results.append(r)
        print(f"{'PASS' if r['ok'] else 'FAIL'}  {name:<10} {secs:6.1f} s  {r['detail']}", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "promises.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    failed = [r["check"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} of {len(results)} promises kept" + (f"; broken: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        r = CHECKS[argv[1]]()
        print(json.dumps(r, default=str))
        return 0 if r["ok"] else 1
    unknown = [a for a in argv if a not in CHECKS]
    if unknown:
        print(f"unknown check(s) {unknown}; the checks: {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    return run_all(argv or list(CHECKS))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
