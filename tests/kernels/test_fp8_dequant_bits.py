"""The FP8 tensor-core kernel's e4m3 -> bf16 bit trick (``hwprofile/skinny_fp8.cuh``), replayed on the CPU for all
256 codes: the word layout, the 2^120 rescale and the NaN flag are what the device code computes, instruction by
instruction (``__byte_perm``, shift, masks, bf16 multiply), checked against torch's own e4m3 decoding."""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HEADER = Path(__file__).parents[2] / "core/src/hwprofile/include/hwprofile/skinny_fp8.cuh"


def byte_perm(a: int, b: int, sel: int) -> int:
    """CUDA's __byte_perm(a, b, s) (selector nibbles 0..7 pick bytes of b:a; the modes with bit 3 set are not used)."""
    src = (b << 32) | a
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def bf16_bits_to_float(h: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", h << 16))[0])


def dequant(word: int) -> list[float]:
    out = []
    for sel in (0x1404, 0x3424):
        p = byte_perm(word, 0, sel)
        q = ((p >> 4) & 0x07F007F0) | (p & 0x80008000)
        for half in (q & 0xFFFF, q >> 16):
            v = bf16_bits_to_float(half) * 2.0**120  # exact: the product is a bf16 value (checked below)
            assert torch.tensor(v, dtype=torch.float32).bfloat16().float().item() == v or math.isnan(v)
            out.append(v)
    return out


def nan_bits(word: int) -> int:
    return ((word & 0x7F7F7F7F) + 0x01010101) & 0xFFFFFFFF


def test_the_replay_uses_the_headers_constants() -> None:
    src = HEADER.read_text()
    for const in ("0x1404", "0x3424", "0x07f007f0u", "0x80008000u", "0x1p120f", "0x7f7f7f7fu", "0x01010101u", "0x80808080u"):
        assert const in src, const
    assert re.search(r"__byte_perm\(w, 0u, 0x1404\)", src)


@pytest.mark.parametrize("pos", range(4))
def test_every_e4m3_code_decodes_exactly_and_nan_is_flagged(pos: int) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e4m3fn).float().tolist()
    filler = [0x3A, 0x00, 0xC1, 0x80]  # other bytes of the word: finite values, +0, -0
    for c in range(256):
        b = list(filler)
        b[pos] = c
        word = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24
        got = dequant(word)
        flagged = nan_bits(word) & 0x80808080
        if math.isnan(want[c]):
            assert flagged >> (8 * pos + 7) & 1, f"code {c:#04x}: NaN not flagged"
            assert abs(got[pos]) == 480.0  # the bit trick's reading of s.1111.111, past the largest finite 448
        else:
            assert not flagged, f"code {c:#04x}: flagged as NaN"
            assert got[pos] == want[c] and math.copysign(1, got[pos]) == math.copysign(1, want[c]), f"code {c:#04x}"
        for i in range(4):
            if i != pos:
                assert got[i] == torch.tensor([b[i]], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()
