"""CLI papercuts of issue 26: show --json's format, version and in-process stats; compile's wording,
legend and help; plugins in natural order; one plugin, one label."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import cli
from hwprofile._entrypoints import natural_key
from hwprofile.cli import main
from hwprofile.kernels import _pipeline as jit
from hwprofile.kernels import toolchain


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- show --json ---------------------------------------------------------------------------------


def test_show_json_has_its_format_and_the_core_version(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "show", "--simulate", "h200", "--json")
    d = json.loads(out)
    assert list(d)[:3] == ["format", "hwprofile", "fingerprint"] and d["format"] == cli.SHOW_FORMAT == 1
    assert d["hwprofile"] == hwprofile.__version__
    env = {**os.environ, "HWPROFILE_DEVICE": "h200"}
    p = subprocess.run([sys.executable, "-m", "hwprofile.cli", "show", "--json"], env=env, capture_output=True, text=True, check=True)
    assert json.loads(p.stdout)["stats"] == {}  # the program's own process ran no op


def test_show_json_in_the_process_that_ran_ops_has_its_dispatch_counts(capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from hwprofile import ops

    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    ops.reset_dispatch()
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)  # CPU tensors count as device 0 (the simulated H200)
    monkeypatch.setattr(ops._kernel, "launch", lambda t, op, out, x, w, *a: bool(out.copy_(x.float() @ w.float().t()).shape))
    prof = hwprofile.profile(0)
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    ops.gemv(x, torch.zeros(64, 512, dtype=torch.bfloat16))  # inside the measured region: the kernel, unless re-tuned
    ops.gemv(x, torch.zeros(2, 512, dtype=torch.bfloat16))  # N = 2 is below every min_n: the fallback
    expected = prof.stats.as_dict()["gemv"]
    assert sum(expected.values()) == 2 and expected["fallback"] >= 1
    for argv in (["show", "--json"], ["show", "--json", "--simulate", "h200"]):  # the same device as the process's: kept
        _, out, _ = run(capsys, *argv)
        assert json.loads(out)["stats"]["gemv"] == expected
    assert hwprofile.profile(0) is prof  # the engine's profile (and its counters) survived main()
    _, out, _ = run(capsys, "show")
    assert "kernel calls" in out and "fallback calls" in out
    ops.reset_dispatch()


def test_show_explains_the_fingerprint(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "show", "--simulate", "h200")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("fingerprint: ")]
    assert line.endswith(f"({cli.FINGERPRINT_NOTE})") and "equal fingerprints dispatch alike" in line


# --- compile -------------------------------------------------------------------------------------


@pytest.fixture
def fake_nvrtc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, ...]]:
    """NVRTC replaced by a recorder (an instant 1 KiB cubin, 40 registers), into an empty private cache."""
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("HWPROFILE_CACHE_DIR", str(d))
    calls: list[tuple[str, ...]] = []

    def compile_(source: str, name: str, options: Any, exprs: Any, *, what: str) -> tuple[bytes, dict[str, str], str]:
        calls.append(tuple(exprs))
        return b"\0" * 1024, {e: f"_Z{len(e)}k" for e in exprs}, "ptxas info    : Used 40 registers, 0 bytes spill stores"

    monkeypatch.setattr(toolchain, "nvrtc_compile", compile_)
    monkeypatch.setattr(toolchain, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(toolchain, "nvrtc_build", lambda: "fake")
    monkeypatch.setattr(jit, "check_toolchain", lambda: None)
    monkeypatch.setattr(jit, "include_dirs", lambda: (toolchain.OWN_INCLUDE,))
    return calls


def _instances_column(out: str) -> dict[tuple[str, str], str]:
    lines = out.splitlines()
    start = lines[1].split("  ")  # the dashes under the header give the columns
    widths = [len(c) for c in start if c]
    rows = {}
    for ln in lines[2:]:
        if ln.startswith("instances:"):
            break
        cells, pos = [], 0
        for w in widths:
            cells.append(ln[pos : pos + w].strip())
            pos += w + 2
        rows[(cells[0], cells[2])] = cells[3]
    return rows


def test_a_first_compile_calls_shared_instances_shared_not_cached(capsys: pytest.CaptureFixture[str],
                                                                  fake_nvrtc: list[tuple[str, ...]]) -> None:
    code, out, _ = run(capsys, "compile", "--arch", "sm_90a,sm_100a", "--jobs", "4")
    assert code == 0
    rows = _instances_column(out)
    assert not [s for s in rows.values() if "cached" in s], out  # nothing was in the cache before this run
    assert rows[("linear_bf16_fp32", "sm_90a")].endswith("shared with router_gemm"), out
    first = len(fake_nvrtc)
    code, out, _ = run(capsys, "compile", "--arch", "sm_90a,sm_100a", "--json")
    doc = json.loads(out)
    assert code == 0 and len(fake_nvrtc) == first  # everything came from the cache
    for r in doc:
        assert r["compiled"] == 0 and r["cached"] + r["shared"] == r["instances"] and r["registers"] == 40
    shared = {(r["op"], r["target"]): r for r in doc if r["shared"]}
    assert shared[("linear_bf16_fp32", "sm_90a")]["shared_with"] == ["router_gemm"]
    assert first == sum(r["cached"] for r in doc)  # each entry compiled once on the first run, read once on the second


def test_compile_table_has_a_legend(capsys: pytest.CaptureFixture[str], fake_nvrtc: list[tuple[str, ...]]) -> None:
    _, out, _ = run(capsys, "compile", "--arch", "sm_90a")
    legend = out.split("\ninstances: ", 1)[1].rsplit("\n", 2)[0]
    for column in ("compiled =", "cached =", "shared with OP", "per inst. =", "cubins =", "max regs =", "spill B ="):
        assert column in legend
    assert out.splitlines()[-1].startswith("5/5 kernels ready")  # sm_90a: the four ops' kernels and moe_gate's selection


def test_compile_help_says_the_default_is_every_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: all, every target of every installed architecture plugin)" in out


# --- plugins in natural order ---------------------------------------------------------------------


def test_natural_key_orders_numbers_as_numbers() -> None:
    assert sorted(["sm120", "sm90", "sm100", "myengine"], key=natural_key) == ["myengine", "sm90", "sm100", "sm120"]
    assert sorted(["sm_121a", "sm_90a", "sm_103a", "sm_100a"], key=natural_key) == ["sm_90a", "sm_100a", "sm_103a", "sm_121a"]


def _in_order(text: str, *names: str) -> bool:
    at = [text.index(n) for n in names]
    return at == sorted(at)


def test_plugins_are_listed_in_natural_order(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    _, out, _ = run(capsys, "plugins", "--json")
    assert [p["name"] for p in json.loads(out)["plugins"]] == ["hwprofile", "myengine", "sm90", "sm100", "sm120"]  # core's own first
    _, out, _ = run(capsys, "plugins")
    assert _in_order(out, "\nsm90 ", "\nsm100 ", "\nsm120 ")
    assert _in_order(cli.version_text(), "plugin sm90:", "plugin sm100:", "plugin sm120:")
    _, out, _ = run(capsys, "doctor", "--json")
    assert [k for k in json.loads(out)["versions"] if k.startswith("plugin ")] == ["plugin hwprofile", "plugin myengine", "plugin sm90",
                                                                                    "plugin sm100", "plugin sm120"]
    _, _, err = run(capsys, "compile", "--arch", "sm_75")
    assert "installed targets: sm_90a, sm_100a, sm_103a, sm_120a, sm_121a" in err


def test_show_names_plugins_in_natural_order(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    monkeypatch.setenv("HWPROFILE_PLUGIN", "sm91")
    code, _, err = run(capsys, "show")
    assert code == 2 and "architecture plugins: sm90, sm100, sm120" in err
    monkeypatch.delenv("HWPROFILE_PLUGIN")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "sm91")
    hwprofile.reset()
    assert run(capsys, "show")[0] == 0
    assert "installed plugins: hwprofile, myengine, sm90, sm100, sm120" in caplog.text


# --- one plugin, one label -------------------------------------------------------------------------


def test_one_plugin_has_one_label_in_provenance(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's declared defaults and its values name it alike: ``myengine-hwprofile 0.3.0``, not also
    ``myengine (myengine-hwprofile 0.3.0)``."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    _, out, _ = run(capsys, "show", "--json")
    d = json.loads(out)
    sources = {layer["source"] for s in d["settings"].values() for layer in s["chain"]}
    sources |= {e["source"] for e in d["env_defaults"].values()}
    for plugin in hwprofile.profile(0).participants:
        assert {s for s in sources if plugin.distribution and plugin.distribution in s} == {plugin.source}
    _, out, _ = run(capsys, "explain", "myengine.fused_shared_experts")
    assert "(from myengine-hwprofile 0.3.0)" in out and "myengine (myengine-hwprofile" not in out
