"""What an op of the table lacks to run, in words: the import-time check of ``hwprofile.ops``. Never imports torch.

An op is four pieces (docs/architecture.md, "Adding an op"): its ``OpDef`` in ``hwprofile.optable.OPS``
(which declares its backward and its kernel family), its fallback in ``_fallbacks.FALLBACKS`` (and the
gradient formula its ``OpDef.backward`` names, in ``_fallbacks.BACKWARDS``), a short public function in
``hwprofile.ops`` named as the op, and a kernel in a plugin (optional: without one the op takes its
fallback). :func:`missing_pieces` lists every missing piece of every op at once; ``hwprofile.ops``
raises one error with all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..optable import OpDef


def missing_pieces(
    table: Mapping[str, OpDef],
    fallbacks: Mapping[str, Callable[..., Any]],
    backwards: Mapping[str, Callable[..., Any]],
    public: Mapping[str, Any],
) -> list[str]:
    """Every piece the ops of ``table`` lack (a fallback, the backward they name, a public function), and every
    fallback or backward nobody declares, in words naming the op, the piece and where it goes."""
    out = []
    for name, op in table.items():
        if name not in fallbacks:
            out.append(f"op {name!r} has no fallback: add it to hwprofile.ops._fallbacks.FALLBACKS")
        if op.backward is not None and op.backward not in backwards:
            out.append(
                f"op {name!r} declares backward {op.backward!r}, which hwprofile.ops._fallbacks.BACKWARDS lacks: add the "
                "gradient formula there, or declare backward=None (no gradients)"
            )
        if not callable(public.get(name)):
            out.append(f"op {name!r} has no public function: define hwprofile.ops.{name}() (it calls _call(ENTRIES[{name!r}], ...))")
    out += [f"hwprofile.ops._fallbacks.FALLBACKS has {n!r}, not in the op table (optable.OPS)" for n in fallbacks if n not in table]
    used = {op.backward for op in table.values()}
    out += [f"hwprofile.ops._fallbacks.BACKWARDS has {n!r}, which no OpDef.backward names" for n in backwards if n not in used]
    return out
