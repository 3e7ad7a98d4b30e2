"""Start-up where users are: ``import hwprofile`` loads nothing else, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

CODE = "import sys; before = set(sys.modules); import hwprofile; print(sorted(set(sys.modules) - before))"


def test_import_hwprofile_loads_no_other_module() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['hwprofile']", out


def test_import_hwprofile_needs_no_typing_at_run_time() -> None:
    """In a clean venv nothing has imported typing yet; hwprofile must not be the one (5-18 ms)."""
    code = "import sys; sys.modules.pop('typing', None); import hwprofile; print('typing' in sys.modules, '__future__' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False False", out.stdout + out.stderr


def test_public_names_still_resolve_lazily() -> None:
    import hwprofile

    for name in hwprofile.__all__:
        assert getattr(hwprofile, name) is not None, name
