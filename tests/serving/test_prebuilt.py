"""The prebuilt layer (issue 23 item 3): ``hwprofile compile --package`` writes a wheel project, pip builds and
installs it, and a fresh process with an empty cache and NVRTC blocked serves its first op call from it.

Real NVRTC builds the one instance; the checking process has ``HWPROFILE_NO_COMPILE=1`` *and* an NVRTC that
raises, and a fake driver (no GPU here): its counters must show one hit from the package's layer, no compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc")
pytest.importorskip("torch")
pytest.importorskip("setuptools")

SHAPE = "gemv:1x4096x4096"

CHECK = textwrap.dedent("""
    import json
    import torch
    import hwprofile
    from hwprofile import ops
    from hwprofile.kernels import _pipeline, toolchain, launch
    def blocked(*a, **k):
        raise AssertionError("NVRTC ran")
    toolchain.nvrtc_compile = blocked
    _pipeline.driver_cuda_version = lambda: None
    launch.load_function = lambda key, cubin, lowered, idx, *, what: ("function", lowered)
    launch.LoadedKernel.launch = lambda self, plan, stream, args: None
    ops._kernel.raw_stream = lambda index: 0
    ops._dispatch._cpu_index = 0
    ops.gemv(torch.zeros((1, 4096), dtype=torch.bfloat16), torch.zeros((4096, 4096), dtype=torch.bfloat16))
    prof = hwprofile.profile(0)
    print(json.dumps({"stats": prof.stats.as_dict(), "layers": [str(x.path) for x in __import__(
        "hwprofile.kernels.cache", fromlist=["x"]).open_layers(create=False).read]}))
""")


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert p.returncode == 0, f"{args}: {p.stdout}\n{p.stderr}"
    return p


def test_a_built_layer_wheel_is_found_without_configuration_and_nothing_compiles(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env.update(HWPROFILE_DEVICE="h200", HWPROFILE_DISABLE_PLUGINS="myengine")
    build_env = {**env, "HWPROFILE_CACHE_DIR": str(tmp_path / "build-cache")}
    project = tmp_path / "hwprofile-sm90-cubins"
    run([sys.executable, "-m", "hwprofile.cli", "compile", "--arch", "sm_90a", "--warm", SHAPE, "--package", str(project),
         "--package-name", "hwprofile-sm90-cubins"], build_env, tmp_path)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(project)],
        env, tmp_path)
    (wheel,) = (tmp_path / "dist").glob("hwprofile_sm90_cubins-*.whl")
    site = tmp_path / "fresh-host"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)], env, tmp_path)
    fresh = {**env, "HWPROFILE_CACHE_DIR": str(tmp_path / "empty-cache"), "HWPROFILE_NO_COMPILE": "1",
             "PYTHONPATH": os.pathsep.join([env.get("PYTHONPATH", ""), str(site)])}
    out = json.loads(run([sys.executable, "-c", CHECK], fresh, tmp_path).stdout.splitlines()[-1])
    layer = site / "hwprofile_sm90_cubins" / "cubins"
    assert str(layer) in out["layers"]
    kernels = out["stats"]["kernels"]
    assert kernels["compiles"] == 0 and kernels["loads"] == 1 and kernels["hits"] == {f"{layer} (read-only)": 1}
    assert out["stats"]["gemv"] == {"kernel": 1, "fallback": 0}
    assert not list((tmp_path / "empty-cache").glob("*.cubin"))  # a hit in a read-only layer is not copied
