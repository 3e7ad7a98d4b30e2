"""The register spills .ci/known-spills.txt accepts for the NVRTC in hand (what the compile legs of .ci/run read)."""

from __future__ import annotations

from pathlib import Path

KNOWN_SPILLS = Path(__file__).resolve().parents[2] / ".ci" / "known-spills.txt"


def known_spills(version: tuple[int, int]) -> dict[tuple[str, str], int]:
    """(target, op) -> bytes accepted for NVRTC ``version``: lines of its major (``12``) or of its exact release (``13.0``)."""
    wanted = {str(version[0]), f"{version[0]}.{version[1]}"}
    out: dict[tuple[str, str], int] = {}
    for line in KNOWN_SPILLS.read_text().splitlines():
        f = line.split("#", 1)[0].split()
        if f and f[0] in wanted:
            out[(f[1], f[2])] = int(f[3])
    return out
