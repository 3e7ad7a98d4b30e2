"""Every digest, key and fingerprint that ranks or hosts compare is free of install paths.

The same plugins installed under two prefixes (copied to two temporary directories, each put first on
``sys.path`` of its own process) must give equal profile fingerprints, equal cross-rank entries (the
``kernel.<op>`` digests included: ``kernel.moe_gate``'s options carry ``-I<package>/kernels``), equal
kernel cache keys and equal tuned-file stamps' kernel digests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import hwprofile_sm90
import hwprofile_sm100
import hwprofile_sm120

PROBE = r"""
import json, os, sys
import hwprofile
from hwprofile import kernels
from hwprofile.distributed._summary import profile_entries, entries_digest
from hwprofile.kernels import _pipeline

out = {"files": {}, "profiles": {}}
for name in sys.argv[1:]:
    os.environ["HWPROFILE_DEVICE"] = name
    hwprofile.reset()
    prof = hwprofile.profile()
    entries = profile_entries(prof)
    keys = {}
    for op, spec in prof.kernels.items():
        out["files"][op] = str(spec.source_path())
        try:
            keys[op] = _pipeline.cache_key(spec, prof.target, [str(spec.instances[0])] if spec.instances else [])
        except Exception as exc:  # no NVRTC here: the key cannot be computed, the other digests still are
            keys[op] = f"unavailable: {type(exc).__name__}"
        keys[op + ".source"] = spec.source_digest(kernels.include_dirs())
    out["profiles"][name] = {
        "fingerprint": prof.fingerprint,
        "entries": {k: e.value for k, e in entries.items()},
        "digest": entries_digest(entries, prof.fingerprint).hex(),
        "keys": keys,
    }
print(json.dumps(out))
"""

DEVICES = ("h200", "b200", "rtx-pro-6000")


def _install(prefix: Path) -> Path:
    site = prefix / "lib" / "site-packages"
    for mod in (hwprofile_sm90, hwprofile_sm100, hwprofile_sm120):
        src = Path(mod.__file__).parent
        shutil.copytree(src, site / src.name, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _probe(site: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    env["HWPROFILE_CACHE"] = "0"
    p = subprocess.run([sys.executable, "-c", PROBE, *DEVICES], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def test_two_install_prefixes_give_equal_fingerprints_entries_and_keys(tmp_path: Path) -> None:
    a, b = _probe(_install(tmp_path / "venv-a")), _probe(_install(tmp_path / "other" / "prefix-b"))
    files_a, files_b = a["files"], b["files"]
    assert isinstance(files_a, dict) and isinstance(files_b, dict)
    assert files_a and all(str(tmp_path / "venv-a") in f for f in files_a.values()), files_a  # each process read its own copy
    assert all(str(tmp_path / "other") in f for f in files_b.values()), files_b
    assert "moe_gate" in files_a  # the kernel whose options carry an include directory inside its package
    pa, pb = a["profiles"], b["profiles"]
    assert isinstance(pa, dict) and isinstance(pb, dict) and set(pa) == set(DEVICES)
    for dev in DEVICES:
        for what in ("fingerprint", "digest", "entries", "keys"):
            va, vb = pa[dev][what], pb[dev][what]
            if isinstance(va, dict):
                assert {k: v for k, v in va.items() if vb.get(k) != v} == {}, f"{dev} {what} differ by install prefix"
            assert va == vb, f"{dev} {what} differs by install prefix"
