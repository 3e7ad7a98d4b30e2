"""Served-model decode shapes: the (M, N, K) each op sees in the models engines serve. Never imports torch.

A threshold is only as right as the shapes it was measured at, and engines do not run inside the
box one default grid covers: the shapes come from the models. ``models.toml`` (shipped with core)
holds each model's architecture facts from its published config, with the config's address and
the tensor-parallel degrees it is served with; :func:`shapes` turns them into the problems each op
gets per rank at decode time:

* ``gemv`` (bf16 weights, M = 1) and ``fp8_gemv`` (models served with FP8 weights): every
  projection of a layer, column-parallel ones (q/k/v, gate/up, the LM head) with N split by the
  tensor-parallel degree, row-parallel ones (attention output, down) with K split;
* ``router_gemm`` and ``linear_bf16_fp32`` (the router's fp32 logits): ``[M, hidden] x [experts,
  hidden]^T``, replicated on every rank, for the decode batch sizes in :data:`ROUTER_M` (batch x
  draft tokens under speculative decoding reaches 6 at concurrency 1).

Read by ``hwprofile sweep`` only (its default grid is the catalog plus the op's box edges);
``hwprofile.profile()`` never loads it. A malformed entry, in the shipped file or a user's
(``--models-file``), is a :class:`~hwprofile.errors.SettingError` naming the file, the entry and
what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from ._record import Record, final
from .errors import SettingError
from .optable import TABLE

Shape = tuple[int, int, int]

SHIPPED: Final = Path(__file__).with_name("models.toml")
#: decode batch sizes (M) the router ops are measured at: plain decode, and batch x draft tokens
ROUTER_M: Final = (1, 2, 4, 6, 8, 12, 16)

_INT_KEYS = ("hidden", "heads", "kv_heads", "head_dim", "intermediate", "shared", "experts", "vocab",
             "q_lora", "kv_lora", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_REQUIRED = ("source", "hidden", "heads", "vocab", "tp")
_KNOWN = frozenset((*_INT_KEYS, "source", "tp", "fp8", "attention"))


@final
class Model(Record):
    """One served model's architecture facts (element counts), as its published config gives them."""

    name: str  #: the catalog name (``llama-3.1-8b``)
    source: str  #: the published config the numbers were read from
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  #: dense MLP intermediate size (0: no dense layer)
    shared: int  #: shared-expert intermediate size (0: none)
    experts: int  #: routed experts (0: a dense model)
    vocab: int
    tp: tuple[int, ...]  #: tensor-parallel degrees it is served with
    fp8: bool  #: commonly served with FP8 weights scaled per tensor or per row
    attention: str  #: "gqa" or "mla"
    q_lora: int
    kv_lora: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


def _counts(raw: Mapping[str, Any], what: str) -> dict[str, int]:
    """The entry's counts (absent: 0), each an int >= 0; hidden, heads and vocab >= 1."""
    ints: dict[str, int] = {}
    for key in _INT_KEYS:
        v = raw.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SettingError(f"{what}: {key} must be a count >= 0, got {v!r}")
        ints[key] = v
    for key in ("hidden", "heads", "vocab"):
        if ints[key] < 1:
            raise SettingError(f"{what}: {key} must be >= 1, got {ints[key]}")
    return ints


def _check_attention(ints: dict[str, int], attention: Any, what: str) -> None:
    """An 'mla' entry's latent sizes, or a 'gqa' entry's KV heads and head size (filled in from the others when 0)."""
    if attention not in ("gqa", "mla"):
        raise SettingError(f"{what}: attention must be 'gqa' or 'mla', got {attention!r}")
    if attention == "mla":
        for key in ("q_lora", "kv_lora", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if ints[key] < 1:
                raise SettingError(f"{what}: an 'mla' model needs {key} >= 1 (from its config.json)")
    else:
        ints["kv_heads"] = ints["kv_heads"] or ints["heads"]
        ints["head_dim"] = ints["head_dim"] or ints["hidden"] // ints["heads"]
        if not ints["head_dim"]:
            raise SettingError(f"{what}: head_dim is 0 (hidden < heads): give head_dim from the config")


def _entry(name: str, raw: Any, where: str) -> Model:
    """One catalog entry, checked: every error names the file, the entry and the fix."""
    what = f"{where}: model '{name}'"
    if not isinstance(raw, Mapping):
        raise SettingError(f"{what} is not a table; write it as a table [\"{name}\"] with keys {', '.join(_REQUIRED)}")
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise SettingError(f"{what}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(_KNOWN))}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise SettingError(f"{what}: missing {', '.join(missing)} (copy them from the model's config.json)")
    ints = _counts(raw, what)
    attention = raw.get("attention", "gqa")
    _check_attention(ints, attention, what)
    tp = raw["tp"]
    if not isinstance(tp, list) or not tp or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tp):
        raise SettingError(f"{what}: tp must be a non-empty list of tensor-parallel degrees >= 1, got {tp!r}")
    fp8 = raw.get("fp8", False)
    if not isinstance(fp8, bool):
        raise SettingError(f"{what}: fp8 must be true or false, got {fp8!r}")
    source = raw["source"]
    if not isinstance(source, str) or not source.strip():
        raise SettingError(f"{what}: source must name the published config the numbers come from")
    model = Model(name, source=source, tp=tuple(tp), fp8=fp8, attention=attention, **ints)
    for t in model.tp:
        try:
            _projections(model, t)
        except SettingError as exc:
            raise SettingError(f"{what}: {exc}") from None
    return model


def load(files: Sequence[Path | str] = ()) -> dict[str, Model]:
    """The shipped catalog plus the models of ``files`` (same format), by name.

    A user file's model may not reuse a shipped name (rename it: two sets of numbers under one
    name would make a sweep's report ambiguous).
    """
    import tomllib

    out: dict[str, Model] = {}
    for path in (SHIPPED, *map(Path, files)):
        where = f"model catalog {path}"
        try:
            doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SettingError(f"{where}: file not found; check the --models-file path") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingError(f"{where}: cannot be read ({exc})") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingError(f"{where}: not valid TOML ({exc})") from None
        for name, raw in doc.items():
            if name in out:
                first = SHIPPED if path != SHIPPED else "this file"
                raise SettingError(f"{where}: model '{name}' is already in {first}; give yours another name")
            out[name] = _entry(name, raw, where)
    return out


def _layers(m: Model) -> list[tuple[str, int, int, str]]:
    """(layer, N, K, split) of every weight a decode step multiplies by, unsplit; ``split`` names the
    dimension tensor parallelism divides: "n" (column-parallel), "k" (row-parallel) or "" (replicated)."""
    h = m.hidden
    out: list[tuple[str, int, int, str]] = []
    if m.attention == "mla":
        out += [
            ("q_a_proj", m.q_lora, h, ""),  # the low-rank projections are replicated
            ("kv_a_proj_with_mqa", m.kv_lora + m.qk_rope_head_dim, h, ""),
            ("q_b_proj", m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora, "n"),
            ("kv_b_proj", m.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora, "n"),
            ("o_proj", h, m.heads * m.v_head_dim, "k"),
        ]
    else:
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        out += [("qkv_proj", q + 2 * kv, h, "n"), ("o_proj", h, q, "k")]
    for what, inter in (("mlp", m.intermediate), ("shared_expert", m.shared)):
        if inter:
            out += [(f"{what}.gate_up_proj", 2 * inter, h, "n"), (f"{what}.down_proj", h, inter, "k")]
    out.append(("lm_head", m.vocab, h, "n"))
    return out


def _projections(m: Model, tp: int) -> list[tuple[str, int, int]]:
    """(layer, N, K) of every weight on one rank of ``tp``; a degree that does not divide a split dimension is an error."""
    out = []
    for layer, n, k, split in _layers(m):
        size = n if split == "n" else k if split == "k" else 0
        if size and size % tp:
            raise SettingError(f"tp={tp} does not divide {layer}'s {split.upper()}={size}; drop that degree")
        out.append((layer, n // tp if split == "n" else n, k // tp if split == "k" else k))
    return out


def origins(op: str, models: Mapping[str, Model]) -> dict[Shape, list[str]]:
    """Each (M, N, K) ``op`` sees in ``models`` with the layers it comes from (``llama-3.1-70b tp=8 o_proj``): the layers
    its op-table entry names (``OpDef.layer``), the projections of an FP8-weight op only where the model is served in FP8."""
    d = TABLE.get(op)
    if d is None:
        raise KeyError(f"no op {op!r}; known ops: {', '.join(TABLE)}")
    fp8_weights = d.w_dtype.startswith("float8")
    out: dict[Shape, list[str]] = {}
    for m in models.values():
        if d.layer == "router" and m.experts:
            for t in m.tp:
                for rows in ROUTER_M:
                    out.setdefault((rows, m.experts, m.hidden), []).append(f"{m.name} tp={t} router")
        elif d.layer == "projection" and (m.fp8 or not fp8_weights):
            for t in m.tp:
                for layer, n, k in _projections(m, t):
                    out.setdefault((1, n, k), []).append(f"{m.name} tp={t} {layer}")
    return dict(sorted(out.items()))


def shapes(op: str, models: Mapping[str, Model]) -> list[Shape]:
    """The distinct (M, N, K) problems ``op`` sees in ``models``, sorted."""
    return list(origins(op, models))


def select(models: Mapping[str, Model], names: Iterable[str]) -> dict[str, Model]:
    """The named models; an unknown name is an error listing the known ones."""
    wanted = [n.strip() for n in names if n.strip()]
    unknown = [n for n in wanted if n not in models]
    if unknown:
        raise SettingError(f"unknown model(s) {', '.join(unknown)}; the catalog has: {', '.join(models)}")
    return {n: models[n] for n in wanted}
