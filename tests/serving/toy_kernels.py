"""A one-kernel package with a header reached through ``-I``: what the cache-layer and fleet-store tests compile."""

from __future__ import annotations

from pathlib import Path

EXPR = "scale_kernel<2>"
SRC = '#include "factor.cuh"\ntemplate <int S> __global__ void scale_kernel(float* o) { o[0] = S * FACTOR; }\n'


def toy_package(prefix: Path) -> tuple[Path, Path]:
    """A kernel package and the header directory it reaches through ``-I``, installed under ``prefix``."""
    site, inc = prefix / "site", prefix / "include"
    (site / "toy_layer_kernels").mkdir(parents=True)
    (site / "toy_layer_kernels" / "__init__.py").write_text("")
    (site / "toy_layer_kernels" / "k.cu").write_text(SRC)
    inc.mkdir()
    (inc / "factor.cuh").write_text("#define FACTOR 1\n")
    return site, inc
