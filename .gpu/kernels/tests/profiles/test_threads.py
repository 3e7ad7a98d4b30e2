"""Threads: many threads making a process's first profile() at once all get the same profile (issue 25).

Engines start worker threads that all ask for the profile at start-up. ``profile()`` checked for
re-entry from a plugin against ``sys.modules["hwprofile.registry"]`` before taking its lock, so a
thread arriving while another was still importing the registry read a half-initialised module:
``AttributeError: partially initialized module 'hwprofile.registry' has no attribute
'current_activity'``. Each case runs in a fresh child process (the race is in the first imports).

The plain case (16 threads released by a barrier, 10 processes) is the report's; on an idle machine
the window is a few milliseconds, so the widened cases hold it open: the registry module, once in
``sys.modules``, sleeps before its code runs, and the other threads ask for the profile exactly then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

THREADS = 16

CHILD = textwrap.dedent(
    """
    import importlib, importlib.abc, importlib.machinery, json, sys, threading, time

    mode = sys.argv[1]
    entered = threading.Event()
    if mode != "plain":
        class SlowRegistry(importlib.abc.MetaPathFinder):
            # hold open the moment the registry is in sys.modules but its code has not run yet
            def find_spec(self, name, path=None, target=None):
                if name != "hwprofile.registry":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                run = spec.loader.exec_module

                def exec_module(module):
                    entered.set()
                    time.sleep(0.3)
                    run(module)

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, SlowRegistry())

    import hwprofile

    n = int(sys.argv[2])
    barrier = threading.Barrier(n)
    out = [None] * n

    def first(i):
        if mode == "plain":
            barrier.wait()
        elif i:
            entered.wait(10)  # the others arrive while thread 0 is inside the registry's import
        try:
            if mode == "plugin-api" and i == 0:
                importlib.import_module("hwprofile.plugin")  # an engine thread importing the plugin API imports the registry too
            prof = hwprofile.profile(0)
            out[i] = ["ok", id(prof), prof.fingerprint, prof.plugin and prof.plugin.name]
        except BaseException as exc:
            out[i] = ["error", f"{type(exc).__name__}: {exc}"]

    threads = [threading.Thread(target=first, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"entered": entered.is_set(), "results": out}))
    """
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_") or k in ("HWPROFILE_CACHE_DIR", "HWPROFILE_CONFIG_DIR")}
    env["HWPROFILE_DEVICE"] = "h200"
    return env


def _check(stdout: str, *, widened: bool) -> None:
    doc = json.loads(stdout.strip().splitlines()[-1])
    results = doc["results"]
    errors = [r[1] for r in results if r[0] != "ok"]
    assert not errors, f"{len(errors)} of {THREADS} threads failed: {errors[0]}"
    assert len({r[1] for r in results}) == 1, "threads got different profile objects"
    assert len({r[2] for r in results}) == 1
    if widened:
        assert doc["entered"], "the window was not held open: the registry was not imported by thread 0"


def test_sixteen_threads_first_profile_at_once_plain() -> None:
    """The report's case, ten fresh processes at once (a loaded machine widens the window by itself)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, "plain", str(THREADS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env())
        for _ in range(10)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        _check(out, widened=False)


@pytest.mark.parametrize("mode", ["profile", "plugin-api"])
def test_threads_arriving_while_the_registry_is_half_imported(mode: str) -> None:
    """Thread 0 imports the registry (by its first profile(), or by importing hwprofile.plugin); 15 others ask meanwhile."""
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(THREADS)], capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    _check(r.stdout, widened=True)
