"""hwprofile's public face: the lazy table, __all__ and the type checker's imports name the same things."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import hwprofile
from hwprofile import _state

INIT = pathlib.Path(hwprofile.__file__)


def test_lazy_table_all_and_type_checking_block_agree() -> None:
    tree = ast.parse(INIT.read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module is not None
                typed |= {a.name: imp.module for a in imp.names}
    assert typed == hwprofile._LAZY
    assert sorted(hwprofile.__all__) == hwprofile.__all__ == sorted(hwprofile._LAZY)
    for name in hwprofile.__all__:
        assert getattr(hwprofile, name) is not None


def test_import_loads_no_other_module() -> None:
    code = "import sys; before = set(sys.modules); import hwprofile; print(sorted(set(sys.modules) - before))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['hwprofile']", "import hwprofile must load nothing else (typing included)"


def test_reset_runs_every_registered_callback_and_modules_register_theirs() -> None:
    import hwprofile.kernels.spec
    import hwprofile.registry  # registers the entry-point caches through _entrypoints

    names = _state.registered()
    for expected in ("hwprofile.profiles._forget_profiles", "hwprofile.device.clear_cache",
                     "hwprofile._entrypoints.clear_cache", "hwprofile.kernels.spec._source_digest.cache_clear"):
        assert expected in names
    ran: list[str] = []
    _state.on_reset(lambda: ran.append("extra"))
    try:
        hwprofile.reset()
        assert ran == ["extra"]
    finally:
        _state._callbacks.pop(f"{__name__}.test_reset_runs_every_registered_callback_and_modules_register_theirs.<locals>.<lambda>")


def test_reset_forgets_a_kernel_source_digest(tmp_path, monkeypatch) -> None:
    """After a source changes, reset() is enough: no test needs to reach into a private cache."""
    from hwprofile.kernels.spec import KernelSpec, Launch

    pkg = tmp_path / "digest_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "k.cu").write_text("// one\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = KernelSpec("op", "digest_pkg", "k.cu", ("k",), lambda **_: Launch("k", (1, 1, 1), (1, 1, 1)))
    first = spec.source_digest()
    (pkg / "k.cu").write_text("// two\n")
    assert spec.source_digest() == first  # memoised for the process
    hwprofile.reset()
    assert spec.source_digest() != first
