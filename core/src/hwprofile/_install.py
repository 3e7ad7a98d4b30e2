"""How to install one of this project's distributions, as hints print it: from where it came, never by bare name.

hwprofile, its plugins and pytest-hwprofile are installed from a checkout (``pip install './core[cu13]'``)
or from git (README, "Install"); an index may hold an unrelated package of the same name, so a hint
that says ``pip install 'hwprofile[cu13]'`` or ``pip install pytest-hwprofile`` would fetch whatever
the index serves under that name (dependency confusion). Every hint that installs one of them is
composed here, from where the installed copy came (its ``direct_url.json``, PEP 610): the local
directory it was installed from, or the git URL; failing both, the README's git form. Never imports
anything of hwprofile, never touches the network.
"""

from __future__ import annotations

import json
import os
import shlex
from urllib.parse import unquote, urlsplit

#: The repository the README installs from (its git form).
REPOSITORY = "https://github.com/hwprofile/hwprofile"
#: Where each distribution lives in the repository.
SUBDIRECTORY = {"hwprofile": "core", "pytest-hwprofile": "pytest-hwprofile"}


def _origin(distribution: str) -> tuple[str, str] | None:
    """``("dir", path)`` or ``("git", url)`` of where ``distribution`` was installed from, or None (an index, unknown)."""
    import importlib.metadata

    try:
        text = importlib.metadata.distribution(distribution).read_text("direct_url.json")
        doc = json.loads(text) if text else None
    except (importlib.metadata.PackageNotFoundError, ValueError, OSError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("url"), str):
        return None
    url = doc["url"]
    vcs = doc.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") == "git":
        sub = doc.get("subdirectory")
        rev = vcs.get("requested_revision") or vcs.get("commit_id")
        return "git", f"git+{url}{'@' + rev if rev else ''}{'#subdirectory=' + sub if sub else ''}"
    u = urlsplit(url)
    if u.scheme == "file" and "dir_info" in doc:
        path = unquote(u.path)
        if os.path.isdir(path):
            return "dir", path
    return None


def requirement(distribution: str, extra: str = "") -> str:
    """The pip argument that installs ``distribution`` (with ``[extra]``) from where this copy came, shell-quoted."""
    ex = f"[{extra}]" if extra else ""
    found = _origin(distribution)
    if found is not None and found[0] == "dir":
        return shlex.quote(found[1] + ex)
    local = local_checkout_path(distribution) if found is None else None
    if local is not None:  # not installed yet, but hwprofile came from a checkout that holds it
        return shlex.quote(local + ex)
    url = found[1] if found is not None else f"git+{REPOSITORY}#subdirectory={SUBDIRECTORY.get(distribution, distribution)}"
    return shlex.quote(f"{distribution}{ex} @ {url}")


def command(distribution: str, extra: str = "", *, upgrade: bool = False) -> str:
    """``pip install <requirement>``: a hint's install command for one of this project's distributions."""
    return f"pip install {'-U ' if upgrade else ''}{requirement(distribution, extra)}"


def hwprofile_extra(extra: str, *, upgrade: bool = False) -> str:
    """The command that installs hwprofile's extra ``extra`` (``cu13``, ``cu12``, ``remote``) into this environment."""
    return command("hwprofile", extra, upgrade=upgrade)


def local_checkout_path(distribution: str) -> str | None:
    """The directory ``distribution`` would be installed from in the checkout hwprofile itself came from, if there is one."""
    found = _origin("hwprofile")
    if found is None or found[0] != "dir":
        return None
    path = os.path.join(os.path.dirname(found[1]), SUBDIRECTORY.get(distribution, distribution))
    return path if os.path.isfile(os.path.join(path, "pyproject.toml")) else None
