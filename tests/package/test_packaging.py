"""Every distribution is fit to publish: license, classifiers, URLs, README, compatible pins, extras
that do what the shipped targets need, and install snippets that name the extra."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DISTS = ["core", "plugins/sm90", "plugins/sm100", "plugins/sm120", "examples/downstream", "pytest-hwprofile"]
DEV_TOOLS = ("ruff", "mypy", "black", "flake8", "pylint", "pre-commit", "isort")


def project(d: str) -> dict:
    return tomllib.loads((ROOT / d / "pyproject.toml").read_text())["project"]


def test_license_is_the_full_apache_text_in_every_distribution() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert len(text) > 10000  # the whole license, not a pointer to it
    for d in DISTS:
        assert (ROOT / d / "LICENSE").read_text() == text, f"{d}/LICENSE differs from the top-level LICENSE"


@pytest.mark.parametrize("d", DISTS)
def test_metadata_fit_to_publish(d: str) -> None:
    p = project(d)
    assert p["license"] == "Apache-2.0" and p["license-files"] == ["LICENSE"], d
    assert p["readme"] == "README.md" and (ROOT / d / "README.md").is_file(), d
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in p["classifiers"]), d
    assert {"Homepage", "Source", "Issues"} <= set(p["urls"]), d
    assert p["requires-python"] == ">=3.11"


@pytest.mark.parametrize("d", DISTS)
def test_every_distribution_is_typed(d: str) -> None:
    """Every distribution is typed (mypy --strict over all of them) and says so: ``Typing :: Typed``, and every
    package ships a py.typed as package data (PEP 561). A single-module distribution has no package to carry one,
    so none is one (pytest-hwprofile was, and its users' type checkers saw it untyped)."""
    src = ROOT / d / "src"
    pkgs = [p for p in src.iterdir() if p.is_dir() and not p.name.endswith(".egg-info") and p.name != "__pycache__"]
    assert pkgs and not list(src.glob("*.py")), f"{d}: a top-level module cannot carry py.typed: make it a package"
    data = tomllib.loads((ROOT / d / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {}).get("package-data", {})
    for p in pkgs:
        assert (p / "py.typed").is_file() and "py.typed" in data.get(p.name, []), f"{d}: {p.name} ships no py.typed as package data"
    assert "Typing :: Typed" in project(d)["classifiers"], f"{d}: typed, but its classifiers do not say Typing :: Typed"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each distribution's wheel, built as CI builds them (pip wheel), without an isolated build environment (seconds, no network).

    Under .ci/run, ``CI_WHEELHOUSE`` names the folder of the wheels its install leg built from this tree and installed:
    those are checked (what is shipped), not built a second time.
    """
    house = os.environ.get("CI_WHEELHOUSE")
    if house:
        out = Path(house)
    else:
        pytest.importorskip("setuptools", "77")
        out = tmp_path_factory.mktemp("wheels")
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                                *(str(ROOT / d) for d in DISTS)], capture_output=True, text=True)
        assert build.returncode == 0, build.stderr[-3000:]
    found = {}
    for d in DISTS:
        name = project(d)["name"].replace("-", "_")
        (found[d],) = out.glob(f"{name}-*.whl")
    return found


@pytest.mark.parametrize("d", DISTS)
def test_every_wheel_ships_py_typed(d: str, wheels: dict[str, Path]) -> None:
    """What a user installs: each top-level package of the wheel holds its py.typed, and there is no top-level module."""
    names = zipfile.ZipFile(wheels[d]).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top and all(f"{t}/__init__.py" in names for t in top), f"{wheels[d].name}: top-level modules {sorted(top)}"
    missing = sorted(t for t in top if f"{t}/py.typed" not in names)
    assert not missing, f"{wheels[d].name} ships no py.typed for {missing}"


_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)")  # [text](target), ![alt](target)
_REF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)  # [label]: target
_HTML = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)""", re.I)
_REPO = "https://github.com/hwprofile/hwprofile/"


def _slugs(md: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    body = re.sub(r"```.*?```", "", md, flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#{1,6} (.+)$", body, re.M)}


@pytest.mark.parametrize("d", DISTS)
def test_long_description_links_are_absolute_and_alive(d: str) -> None:
    """The README each distribution publishes as its long description is read on an index page,
    where a relative link points nowhere: every link is absolute, and one into this repository
    names a file (and heading) that exists."""
    readme = ROOT / d / project(d)["readme"]
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", readme.read_text(), flags=re.S))  # not in code
    targets = [*_LINK.findall(text), *_REF.findall(text), *_HTML.findall(text)]
    relative = [t for t in targets if not re.match(r"(https?://|mailto:)", t)]
    assert not relative, f"{d}/README.md has relative links, dead on an index page: {relative}"
    for t in targets:
        m = re.match(re.escape(_REPO) + r"(?:blob|tree)/main/([^#?]*)(?:#(.*))?$", t)
        if m is None:
            continue
        path, anchor = ROOT / m.group(1), m.group(2)
        assert path.exists(), f"{d}/README.md links to {t}, and {m.group(1)} is not in the repository"
        if anchor:
            assert anchor in _slugs(path.read_text()), f"{d}/README.md links to {t}: {m.group(1)} has no heading #{anchor}"


@pytest.mark.parametrize("d", [d for d in DISTS if d != "core"])
def test_dependents_pin_a_compatible_core_range(d: str) -> None:
    import hwprofile

    major, minor = (int(x) for x in hwprofile.__version__.split(".")[:2])
    deps = [x for x in project(d)["dependencies"] if x.startswith("hwprofile")]
    assert deps == [f"hwprofile>={major}.{minor}.0,<{major}.{minor + 1}"], d


def test_scaffold_pins_the_same_range() -> None:
    import hwprofile
    from hwprofile import scaffold

    major, minor = (int(x) for x in hwprofile.__version__.split(".")[:2])
    text = scaffold.files("sm89", "8.9")["pyproject.toml"]
    assert f'dependencies = ["hwprofile>={major}.{minor}.0,<{major}.{minor + 1}"]' in text


def test_test_extra_is_free_of_dev_tools_and_groups_hold_them() -> None:
    extras = project("core")["optional-dependencies"]
    for name, reqs in extras.items():
        assert not [r for r in reqs if r.split(">")[0].split("=")[0].split("[")[0].strip() in DEV_TOOLS], f"extra {name}: {reqs}"
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    flat = " ".join(str(x) for g in groups.values() for x in g)
    assert "ruff" in flat and "mypy" in flat and "pytest" in flat


def test_no_extra_pulls_an_unpublished_name_from_an_index() -> None:
    """Extras resolve from an index: a local-only distribution named there could be a stranger's package."""
    local = {project(d)["name"] for d in DISTS}
    for name, reqs in project("core")["optional-dependencies"].items():
        assert not [r for r in reqs if re.split(r"[<>=\[ ;]", r)[0] in local], name


def test_cu12_floor_compiles_every_shipped_target() -> None:
    from hwprofile.kernels import MIN_NVRTC
    from hwprofile.registry import Registry

    floor = None
    for req in project("core")["optional-dependencies"]["cu12"]:
        m = re.fullmatch(r"nvidia-cuda-nvrtc-cu12>=(\d+)\.(\d+),<13", req)
        if m:
            floor = (int(m.group(1)), int(m.group(2)))
    assert floor is not None
    targets = {t for p in Registry({}).load_entry_points().arch_plugins if p.arch for t in p.arch.targets.values()}
    assert targets >= {"sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a"}
    for t in targets:
        assert MIN_NVRTC[t] <= floor, f"{t} needs NVRTC {MIN_NVRTC[t]}, the cu12 extra allows {floor}"
    for req in project("core")["optional-dependencies"]["cu12"]:
        assert f">={floor[0]}.{floor[1]}," in req, f"cu12 extra: {req} has another floor than NVRTC's"


def _install_snippets() -> list[tuple[str, str]]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / d / "README.md" for d in DISTS)]
    out = []
    for f in files:
        for line in f.read_text().splitlines():
            for m in re.finditer(r"pip install ((?:[^`\n#&]|(?<=\S)#)*)", line):  # up to a comment or the next command
                out.append((str(f.relative_to(ROOT)), m.group(1)))
    return out


def test_every_install_snippet_that_installs_core_names_the_extra() -> None:
    bad = []
    for where, cmd in _install_snippets():
        if re.search(r"(^|\s)'?\./core(\s|'|$)", cmd) or re.search(r"(^|\s)'?hwprofile'?(\s|$)", cmd):
            bad.append(f"{where}: pip install {cmd}")
    snippets = [c for _, c in _install_snippets()]
    assert any("[cu13]" in c for c in snippets) and any("[cu12]" in c for c in snippets)
    # core installed without an extra only where the text says what that leaves out
    allowed = [b for b in bad if "core/README.md" in b]
    assert bad == allowed, "\n".join(bad)


def test_every_local_install_is_a_path() -> None:
    """`pip install hwprofile-sm89` would ask the public index for a name this project never published.

    A path, or a direct reference to this repository (`"hwprofile[cu13] @ git+https://github.com/hwprofile/hwprofile#subdirectory=core"`)."""
    local = {project(d)["name"] for d in DISTS} | {"hwprofile-sm89"}
    bad = []
    for where, cmd in _install_snippets():
        words = cmd.split()
        for i, word in enumerate(words):
            name = re.split(r"[\[<>=]", word.strip("'\""))[0]
            direct = words[i + 1 : i + 3]
            url = direct[1].strip("'\"") if len(direct) == 2 and direct[0] == "@" else ""
            from_repo = url.startswith("git+" + _REPO.rstrip("/") + "#subdirectory=")
            if name in local and not word.lstrip("'\"").startswith(("./", "/", "../")) and not from_repo:
                bad.append(f"{where}: pip install {cmd}")
    assert not bad, "\n".join(bad)


def test_readme_says_how_to_install_unpublished_names() -> None:
    """Until the names are registered on PyPI, the README says how to install them and why never by name."""
    text = " ".join((ROOT / "README.md").read_text().split())
    note = text[text.index("not on PyPI yet"):text.index("**Test it**")]
    assert "git+https://github.com/hwprofile/hwprofile#subdirectory=core" in note and "dependency confusion" in note
    for d in DISTS[:4] + DISTS[5:]:
        assert f"`{project(d)['name']}`" in note, project(d)["name"]
    subdirs = re.findall(r"#subdirectory=([\w/.-]+)", note)
    assert subdirs and all(s in DISTS for s in subdirs), subdirs  # each names a distribution's folder


def test_readme_engine_start_up_names_real_api() -> None:
    """Every hwprofile name the README's "In an engine" block calls exists."""
    import hwprofile
    import hwprofile.distributed
    from hwprofile import ops
    from hwprofile.profiles import Profile

    text = (ROOT / "README.md").read_text()
    start = text.index("## In an engine")
    section = text[start:text.index("\n## ", start + 1)]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    order = ["hwprofile.profile(", "prof.apply_env()", "set_device(", "init_process_group(", "check_agreement()", "ops.router_gemm("]
    assert [block.index(s) for s in order] == sorted(block.index(s) for s in order), "start-up steps out of order"
    for word in ("apply_env()", "warm-up", "check_agreement()", "before CUDA-graph capture", "init_process_group"):
        assert word in section, word
    roots: dict[str, tuple[object, ...]] = {
        "hwprofile.distributed": (hwprofile.distributed,), "hwprofile": (hwprofile,), "ops": (), "prof": (Profile,),
    }
    found = re.findall(r"(?<![\w.])(hwprofile\.distributed|hwprofile|ops|prof)\.(\w+)", section)
    assert {(r, n) for r, n in found} >= {
        ("hwprofile", "profile"), ("prof", "apply_env"), ("hwprofile.distributed", "check_agreement"), ("ops", "router_gemm"),
    }
    for root, name in found:
        if root == "hwprofile" and name == "distributed":
            continue
        if root == "ops":
            assert name in ops.__all__, f"ops.{name}"
        elif root == "hwprofile" and importlib.util.find_spec(f"hwprofile.{name}") is not None:
            continue  # a submodule (hwprofile.cli): an attribute only once imported, whatever ran before
        else:
            assert all(hasattr(o, name) for o in roots[root]), f"{root}.{name}"


def test_readme_run_it_needs_no_torch() -> None:
    text = (ROOT / "README.md").read_text()
    run = text[text.index("**Run it**"):text.index("**Test it**")]
    cmd = re.search(r"```\n(.*?)\n```", run, re.S).group(1)
    assert "torch" not in cmd and "'./core[cu13]'" in cmd and "hwprofile show --simulate" in cmd and "hwprofile compile --arch all" in cmd
    test = text[text.index("**Test it**"):]
    assert re.search(r"```\n\./\.ci/run\n```", test)


def test_readme_has_the_driver_extra_torch_table() -> None:
    text = (ROOT / "README.md").read_text()
    assert "| NVIDIA driver | extra (NVRTC + CUDA headers) | torch build |" in text
    for needle in ("`hwprofile[cu13]`", "`hwprofile[cu12]`", "580"):
        assert needle in text


@pytest.mark.parametrize("d", ["plugins/sm90", "plugins/sm100", "plugins/sm120"])
def test_plugin_readme_says_gpus_served_and_extra(d: str) -> None:
    from hwprofile.registry import Registry

    text = (ROOT / d / "README.md").read_text()
    reg = Registry({}).load_entry_points()
    plugin = next(p for p in reg.arch_plugins if p.distribution == project(d)["name"])
    assert plugin.arch is not None
    for (major, minor), target in plugin.arch.targets.items():
        assert f"{major}.{minor}" in text and target in text, f"{d}/README.md does not name {major}.{minor} / {target}"
    assert "[cu13]" in text and "[cu12]" in text


def test_pytest_plugin_is_not_in_core() -> None:
    """pytest rewrites every module of a distribution with a pytest11 entry point."""
    core = tomllib.loads((ROOT / "core" / "pyproject.toml").read_text())["project"]
    assert "pytest11" not in core.get("entry-points", {})
    assert project("pytest-hwprofile")["entry-points"]["pytest11"] == {"hwprofile": "pytest_hwprofile"}
    src = ROOT / "core" / "src" / "hwprofile"
    assert not [p.name for p in src.glob("*.py") if "PYTEST_DONT_REWRITE" in p.read_text()]
    assert not (src / "testing.py").exists()


def test_hwprofile_modules_are_not_marked_for_rewrite(pytestconfig: pytest.Config) -> None:
    hook = pytestconfig.pluginmanager.rewrite_hook
    marked = getattr(hook, "_must_rewrite", None)
    if marked is None:
        pytest.skip("this pytest keeps no _must_rewrite set")
    assert "hwprofile" not in marked and not [m for m in marked if m.startswith("hwprofile.")]
