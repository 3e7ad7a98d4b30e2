"""No hint installs one of this project's distributions by a bare name an index could serve (dependency confusion)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hwprofile import _deps, _install, _remote

ROOT = Path(__file__).resolve().parents[2]
# pip install [-U] 'hwprofile[...]' / hwprofile-sm90 / pytest-hwprofile, not followed by " @ " (a direct reference)
BARE = re.compile(
    r"pip install (?:-U )?['\"]?(?:hwprofile|pytest-hwprofile|hwprofile-\w+)(?:\[[\w,]+\])?['\"]?(?!\S* @ )(?=[\s'\"`;),.]|$)"
)


def test_no_source_hint_names_a_distribution_of_ours_by_bare_name() -> None:
    found = []
    for base in ("core/src", "pytest-hwprofile/src", "plugins", "examples"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if path.name == "_install.py" or "build" in path.parts:
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if BARE.search(line) and "never" not in line:
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_hints_name_where_hwprofile_came_from() -> None:
    for text in (_deps.cuda_extra(), _remote.install(), _install.hwprofile_extra("cu12", upgrade=True)):
        assert not BARE.search(text), text
        assert "[cu" in text or "[remote]" in text
    assert not BARE.search(_install.command("pytest-hwprofile"))


def test_an_install_from_an_index_gets_the_git_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_install, "_origin", lambda dist: None)
    assert _install.hwprofile_extra("cu13") == "pip install 'hwprofile[cu13] @ git+https://github.com/hwprofile/hwprofile#subdirectory=core'"
    assert _install.command("pytest-hwprofile").endswith("#subdirectory=pytest-hwprofile'")
