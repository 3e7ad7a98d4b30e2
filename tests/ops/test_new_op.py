"""Adding an op is four pieces (docs/architecture.md, "Adding an op"), carried out for real on a copy of the package.

A fifth op with a non-linear epilogue, ``silu_gemv = silu(x . w^T)`` (bf16, M = 1), is written into a copy of
``hwprofile`` exactly where the recipe says (its ``OpDef`` in ``optable.OPS``, its fallback and gradient formula in
``ops/_fallbacks.py``, its public function in ``ops/__init__.py``), its float64 reference into a copy of
tests/ops/reference.py, and its kernel into a plugin registered by entry point. A subprocess with that copy
first on ``sys.path`` then runs the real contract, autograd and family suites over it: outputs and gradients
against float64, through the real import path (no table is patched). Each wrong or missing piece fails:
the GEMM's backward declared for it, the skinny-GEMM family claimed for it, any piece left out (one error
names them all).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

# --- the pieces, as a developer writes them -----------------------------------------------------------

OPDEF = """
SILU_GEMV = OpDef(
    "silu_gemv",
    "decode GEMV with a SiLU epilogue: silu(x[..., K] bf16 . w[N, K]^T) -> [..., N] bf16, fp32 accumulation",
    args=("x", "w"),
    w_dtype="bfloat16",
    out_dtype="bfloat16",
    fallback="silu(torch.mm(out_dtype=torch.float32)) rounded to bf16",
    max_m=1,
    min_n=64,
    max_n=65536,
    n_multiple=8,
    min_k=8,
    max_k=65536,
    k_multiple=8,
    threshold="box",
    grid=_GEMV_GRID,
    layer="projection",
    settings=(_measured("silu_gemv"), _model("silu_gemv")),
    family=None,
    backward="silu_gemm",
)
"""

FALLBACK = '''
def silu_mm(x: Any, w: Any) -> Any:
    """``silu(x . w^T)`` in fp32, one rounding to bf16."""
    return _torch.nn.functional.silu(mm_fp32(x, w)).to(_torch.bfloat16)


def silu_gemm_backward(g: Any, x: Any, w: Any, scale: Any, need_x: bool, need_w: bool) -> tuple[Any, Any]:
    """Gradients of ``y = silu(x . w^T)`` in fp32 accumulation: dL/dz = g * s * (1 + z * (1 - s)), s = sigmoid(z)."""
    n, k = w.shape
    x2, wf = x.reshape(-1, k).float(), w.float()
    z = x2 @ wf.t()
    s = _torch.sigmoid(z)
    dz = g.reshape(-1, n).float() * s * (1 + z * (1 - s))
    gx = (dz @ wf).to(x.dtype).reshape(x.shape) if need_x else None
    gw = (dz.t() @ x2).to(w.dtype) if need_w else None
    return gx, gw

'''

PUBLIC = '''
def silu_gemv(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[..., K] bf16 . w[N, K]^T) -> [..., N] bf16`` with fp32 accumulation."""
    return _call(ENTRIES["silu_gemv"], x, w, None, out)  # type: ignore[no-any-return]

'''

REFERENCE = """    "silu_gemv": lambda x, w: torch.nn.functional.silu(_gemm(x, w)),
"""

KERNEL = r"""// silu_gemv: out[n] = silu(sum_k x[k] w[n, k]), one warp per output row, fp32 accumulation; the op ABI.
#include <cuda_bf16.h>

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) silu_gemv(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                                       const __nv_bfloat16* __restrict__ w, const float* scale, int m, int n, int k) {
  const int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n) return;
  float acc = 0.f;
  for (int i = lane; i < k; i += 32) acc += __bfloat162float(x[i]) * __bfloat162float(w[(long long)row * k + i]);
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[row] = __float2bfloat16(acc / (1.f + __expf(-acc)));
}
"""

PLUGIN = '''"""A downstream plugin with the silu_gemv kernel."""

from typing import Any

from hwprofile.plugin import DeviceInfo, KernelSpec, Launch, hookimpl


def _configure(*, n: int, **_: Any) -> Launch:
    return Launch("silu_gemv<4>", (-(-n // 4), 1, 1), (128, 1, 1))


@hookimpl
def hwprofile_kernels(device: DeviceInfo, target: str) -> list[KernelSpec]:
    return [KernelSpec("silu_gemv", __name__, "silu_gemv.cu", ("silu_gemv<4>",), _configure, doc="silu(x . w^T), M = 1")]
'''

KERNEL_TEST = '''"""The kernel piece: served by its plugin on every simulated architecture (no family claims it), and it compiles."""

import pytest

import hwprofile
from hwprofile.plugin import PREBUILT_SHAPES, compile_kernel


def test_the_family_does_not_claim_the_op() -> None:
    assert "silu_gemv" not in PREBUILT_SHAPES


@pytest.mark.parametrize("device", ["h200", "b200", "rtx-pro-6000"])
def test_the_op_is_served_by_its_own_kernel(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", device)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    spec = prof.kernels["silu_gemv"]
    assert spec.package == "silu_plugin", spec.describe()
    d = hwprofile.ops.decide("silu_gemv", prof, m=1, n=2048, k=4096)
    assert d.gate in (None, "model")  # inside the kernel's limits: its cost model decides (no limit refuses it)
    pytest.importorskip("cuda.bindings.nvrtc")
    assert compile_kernel(spec, prof.target).cubin[:4] == b"\\x7fELF"
'''


def _insert(path: Path, anchor: str, text: str, *, after: bool = False) -> None:
    """Put ``text`` before (or after) the one line starting with ``anchor`` in ``path``: a documented place, or this test fails."""
    src = path.read_text()
    lines = src.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith(anchor)]
    assert len(at) == 1, f"{path.name}: the recipe's anchor {anchor!r} is not one line ({len(at)} found)"
    i = at[0] + (1 if after else 0)
    path.write_text("".join(lines[:i]) + text + "".join(lines[i:]))


def _replace(path: Path, old: str, new: str) -> None:
    src = path.read_text()
    assert src.count(old) == 1, f"{path.name}: {old!r} is not found once"
    path.write_text(src.replace(old, new))


def build(tmp: Path, *, skip: tuple[str, ...] = (), family: str = "None", backward: str = '"silu_gemm"') -> Path:
    """A copy of hwprofile and tests/ops with the fifth op's pieces, and its plugin; returns the folder to put on sys.path."""
    root = tmp / "tree"
    shutil.copytree(ROOT / "core/src/hwprofile", root / "hwprofile", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tests").mkdir()
    for f in ("__init__.py", "conftest.py"):
        shutil.copy(ROOT / "tests" / f, root / "tests" / f)
    shutil.copytree(ROOT / "tests/ops", root / "tests/ops", ignore=shutil.ignore_patterns("__pycache__"))
    pkg = root / "hwprofile"
    if "opdef" not in skip:  # 1. the OpDef, in the table
        opdef = OPDEF.replace("family=None", f"family={family}").replace('backward="silu_gemm"', f"backward={backward}")
        _insert(pkg / "optable.py", "#: every op, by name", opdef + "\n")
        _replace(
            pkg / "optable.py",
            "(ROUTER_GEMM, LINEAR_BF16_FP32, GEMV, FP8_GEMV)}",
            "(ROUTER_GEMM, LINEAR_BF16_FP32, GEMV, FP8_GEMV, SILU_GEMV)}",
        )
    if "fallback" not in skip:  # 2. the fallback and its gradient formula
        _insert(pkg / "ops/_fallbacks.py", "#: op name -> its fallback on 2-D contract operands", FALLBACK)
        _insert(pkg / "ops/_fallbacks.py", "    optable.FP8_GEMV.name: fp8_mm,", '    "silu_gemv": silu_mm,\n', after=True)
        if "backward" not in skip:
            _insert(
                pkg / "ops/_fallbacks.py", "    optable.GEMM_BACKWARD: gemm_backward,", '    "silu_gemm": silu_gemm_backward,\n', after=True
            )
    if "public" not in skip:  # 3. the public function
        _insert(pkg / "ops/__init__.py", "def moe_gate(", PUBLIC + "\n")
    _insert(root / "tests/ops/reference.py", '    "fp8_gemv": _gemm,', REFERENCE, after=True)  # the test suite's float64 truth
    # 4. the kernel, in a plugin found by entry point
    (root / "silu_plugin").mkdir()
    (root / "silu_plugin/__init__.py").write_text(PLUGIN)
    (root / "silu_plugin/silu_gemv.cu").write_text(KERNEL)
    info = root / "silu_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: silu-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hwprofile.plugins]\nsilu = silu_plugin\n")
    (root / "tests/ops/test_silu_kernel.py").write_text(KERNEL_TEST)
    return root


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWPROFILE_")}
    env["PYTHONPATH"] = str(root)
    env["HWPROFILE_CACHE_DIR"] = os.environ.get("HWPROFILE_CACHE_DIR", str(root / "cache"))
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)


def pytest_in(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "hwprofile_guard_device=false", *args)


def test_the_copy_imports_its_own_hwprofile(tmp_path: Path) -> None:
    root = build(tmp_path)
    r = run(root, "-c", "import hwprofile, hwprofile.ops as o; print(hwprofile.__file__); print('silu_gemv' in o.__all__)")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [str(root / "hwprofile/__init__.py"), "True"]


def test_the_fifth_op_passes_the_suites_outputs_and_gradients_against_float64(tmp_path: Path) -> None:
    root = build(tmp_path)
    r = pytest_in(
        root, "tests/ops/test_contract.py", "tests/ops/test_autograd.py", "tests/ops/test_silu_kernel.py", "-k", "silu_gemv or silu_kernel"
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    # the contract checks, the reference, both gradient tests (eager, compiled), the kernel's tests
    tail = r.stdout.strip().splitlines()[-1]
    passed = int(tail.split(" passed")[0].split()[-1])
    assert passed >= 13, r.stdout[-2000:]


def test_the_gemms_backward_declared_for_it_fails_the_gradient_test(tmp_path: Path) -> None:
    """The old default: every op's backward was the GEMM's. The op imports (``gemm`` exists) and its gradients are wrong."""
    root = build(tmp_path, backward='"gemm"', skip=("backward",))
    r = pytest_in(root, "tests/ops/test_autograd.py", "-k", "silu_gemv and eagerly")
    assert r.returncode == 1 and "silu_gemv: gradient of x off the float64 reference" in r.stdout, r.stdout[-3000:]


def test_no_backward_refuses_a_gradient_by_name(tmp_path: Path) -> None:
    root = build(tmp_path, backward="None", skip=("backward",))
    code = (
        "import torch, hwprofile.ops as o\n"
        "x = torch.randn(1, 64).bfloat16().requires_grad_(); w = torch.randn(64, 64).bfloat16()\n"
        "with torch.no_grad(): assert o.silu_gemv(x, w).shape == (1, 64)\n"
        "try: o.silu_gemv(x, w)\n"
        "except ValueError as e: print(e)\n"
    )
    r = run(root, "-c", code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "silu_gemv: x requires grad, but silu_gemv has no backward (its OpDef declares backward=None)" in r.stdout


def test_a_declared_but_unused_backward_is_named(tmp_path: Path) -> None:
    """The formula written, the GEMM's declared: the import names the formula nobody uses."""
    root = build(tmp_path, backward='"gemm"')
    r = run(root, "-c", "import hwprofile.ops")
    assert r.returncode != 0 and "BACKWARDS has 'silu_gemm', which no OpDef.backward names" in r.stderr, r.stderr[-2000:]


def test_the_family_claimed_for_it_fails_the_family_test(tmp_path: Path) -> None:
    """Declared a skinny-GEMM member, every plugin on the family would serve it a plain GEMV without its SiLU."""
    root = build(tmp_path, family="SKINNY_GEMM")
    r = pytest_in(root, "tests/ops/test_contract.py", "-k", "family and silu_gemv")
    assert r.returncode == 1 and "silu_gemv is declared in the skinny-GEMM family" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("torch_first", [True, False])
def test_one_error_names_every_missing_piece(tmp_path: Path, torch_first: bool) -> None:
    root = build(tmp_path, skip=("fallback", "public"))
    r = run(root, "-c", ("import torch\n" if torch_first else "") + "import hwprofile.ops")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("hwprofile.errors.HwprofileError: hwprofile.ops: the op table is incomplete (3 missing piece(s);"), last
    for piece in (
        "op 'silu_gemv' has no fallback: add it to hwprofile.ops._fallbacks.FALLBACKS",
        "op 'silu_gemv' declares backward 'silu_gemm', which hwprofile.ops._fallbacks.BACKWARDS lacks",
        "op 'silu_gemv' has no public function: define hwprofile.ops.silu_gemv()",
    ):
        assert piece in last, last


def test_a_public_function_without_a_table_entry_is_named(tmp_path: Path) -> None:
    root = build(tmp_path, skip=("opdef",))
    r = run(root, "-c", "import hwprofile.ops")
    assert r.returncode != 0
    assert "FALLBACKS has 'silu_gemv', not in the op table (optable.OPS)" in r.stderr, r.stderr[-2000:]
    assert "BACKWARDS has 'silu_gemm', which no OpDef.backward names" in r.stderr
