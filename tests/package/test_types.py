"""What py.typed promises, mypy confirms: an engine's and a plugin's code type-check against hwprofile."""

from __future__ import annotations

from pathlib import Path

import pytest

ENGINE = '''
import hwprofile
from hwprofile.plugin import DeviceInfo, Value, hookimpl

prof = hwprofile.profile()
reveal_type(prof.get("router_gemm.max_tokens", int))
reveal_type(prof.get_bool("gemv.split_k"))
reveal_type(prof.device.compute_capability)
reveal_type(prof.explain("gemv.split_k").winner.kind)
n: int = prof.get("router_gemm.max_tokens", int) + 1

@hookimpl
def hwprofile_settings(device: DeviceInfo, resolved: dict[str, object]) -> dict[str, Value]:
    return {"router_gemm.max_tokens": Value(8, "why")}
'''

WRONG = '''
import hwprofile

prof = hwprofile.profile()
s: str = prof.get("router_gemm.max_tokens", int)
prof.fingerprint = "x"
len(prof.device)
prof.get("router_gemm.max_tokens", list)
from hwprofile.plugin import Launch  # a record's synthesized __init__ is checked at every construction site
Launch("k<1>", (1, 1, 1), (32, 1, 1), shared_bytes="0")
Launch("k<1>", (1, 1, 1))
'''


def test_engine_code_type_checks(tmp_path: Path) -> None:
    """One mypy run over both files (torch not followed: its types are torch's business, and reading them is most of the time)."""
    api = pytest.importorskip("mypy.api")
    (tmp_path / "engine.py").write_text(ENGINE)
    (tmp_path / "wrong.py").write_text(WRONG)
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\n[mypy-torch,torch.*]\nfollow_imports = skip\n")
    cache = ["--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"), "--no-incremental"]
    out, err, status = api.run([*cache, str(tmp_path / "engine.py"), str(tmp_path / "wrong.py")])
    assert status == 1, out + err
    engine = [line for line in out.splitlines() if line.startswith(str(tmp_path / "engine.py"))]
    assert not [line for line in engine if ": error:" in line], out
    revealed = [line.split("Revealed type is ")[1].replace("builtins.", "") for line in engine if "Revealed type" in line]
    assert revealed[:3] == ['"int"', '"bool"', '"tuple[int, int]"'], out
    assert all(f"Literal['{k}']" in revealed[3] for k in ("core", "declared", "arch", "downstream", "tuned", "env")), out
    errors = [line for line in out.splitlines() if line.startswith(str(tmp_path / "wrong.py")) and ": error:" in line]
    assert [int(line.split(":")[1]) for line in errors] == [5, 6, 7, 8, 10, 11], out
