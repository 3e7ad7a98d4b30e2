"""The hand-written entry-point scan (hwprofile._entrypoints) gives importlib.metadata's answer."""

from __future__ import annotations

from importlib import metadata

import pytest

from hwprofile import _entrypoints, registry


def test_scan_finds_the_plugins_importlib_metadata_finds() -> None:
    fast = {(e.name, e.value, e.distribution, e.version) for e in _entrypoints.find_entry_points(registry.ENTRY_POINT_GROUP)}
    slow = {
        (ep.name, ep.value, ep.dist.metadata["Name"] if ep.dist else None, ep.dist.version if ep.dist else None)
        for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP)
    }
    assert fast == slow
    assert {"sm90", "sm100", "sm120", "myengine"} <= {name for name, *_ in fast}


def test_scan_agrees_on_another_group() -> None:
    group = "pytest11"  # the test plugins installed here: a group the scan was not written for
    fast = {(e.name, e.value) for e in _entrypoints.find_entry_points(group)}
    assert fast == {(ep.name, ep.value) for ep in metadata.entry_points(group=group)}


def test_installed_versions_match_importlib_metadata() -> None:
    dists: dict[str, str] = {}
    for d in metadata.distributions():  # sys.path order: the first one found shadows the others
        if d._path.name.endswith(".dist-info"):  # type: ignore[attr-defined]
            dists.setdefault(d.metadata["Name"], d.version)
    assert len(dists) > 5
    _entrypoints.clear_cache()
    for name, version in dists.items():
        assert _entrypoints.installed_version(name) == version, name
    assert _entrypoints.installed_version("no-such-distribution-xyz") is None


def test_reset_forgets_the_directory_listings(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hwprofile

    monkeypatch.syspath_prepend(str(tmp_path))
    assert _entrypoints.installed_version("late-dist") is None
    (tmp_path / "late_dist-1.2.3.dist-info").mkdir()
    (tmp_path / "late_dist-1.2.3.dist-info" / "METADATA").write_text("Name: late-dist\nVersion: 1.2.3\n\n")
    assert _entrypoints.installed_version("late-dist") is None  # the listing is remembered
    hwprofile.reset()
    assert _entrypoints.installed_version("late-dist") == "1.2.3"
