"""The served-model shape catalog (hwprofile.models): the shipped configs, the shapes each op sees per
rank, and refusal of malformed entries with the file, the entry and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwprofile import models, sweep
from hwprofile.errors import SettingError
from hwprofile.optable import OPS, TABLE, OpDef


@pytest.fixture(scope="module")
def catalog() -> dict[str, models.Model]:
    return models.load()


def test_the_shipped_catalog_covers_the_served_families(catalog: dict[str, models.Model]) -> None:
    families = ("llama-3.1", "qwen3", "mistral", "mixtral", "deepseek-v3", "kimi-k2", "glm-4.5", "gpt-oss", "llama-4")
    for family in families:
        assert any(name.startswith(family) for name in catalog), family
    for m in catalog.values():
        assert m.source.startswith("https://huggingface.co/") and m.source.endswith("config.json"), m.name


@pytest.mark.parametrize("op", list(TABLE))
def test_every_op_of_the_table_has_catalog_shapes(op: str, catalog: dict[str, models.Model]) -> None:
    """A new op must say which layers of served models it takes (OpDef.layer), or it is swept nowhere models run."""
    assert models.shapes(op, catalog), f"{op}: no served-model shapes; name its layer in its op-table entry (OpDef.layer)"


@pytest.mark.parametrize(("layer", "w_dtype", "like"), [("router", "bfloat16", "router_gemm"), ("projection", "bfloat16", "gemv"),
                                                        ("projection", "float8_e4m3fn", "fp8_gemv"), (None, "bfloat16", None)])
def test_the_layers_an_op_sees_are_its_table_entrys(layer: str | None, w_dtype: str, like: str | None, catalog: dict[str, models.Model],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A new op's served shapes follow its OpDef.layer (and an FP8 weight), with no list of op names in hwprofile.models."""
    toy = OpDef("toy", "toy", args=("x", "w"), w_dtype=w_dtype, out_dtype="float32", fallback="f", max_m=16, min_n=1, max_n=1 << 20,
                min_k=1, max_k=1 << 20, threshold="max_tokens", grid=(), settings=(), layer=layer, family=None, backward=None)
    monkeypatch.setitem(TABLE, "toy", toy)
    assert models.shapes("toy", catalog) == (models.shapes(like, catalog) if like else [])
    assert models.shapes("moe_gate", catalog) == models.shapes("router_gemm", catalog)  # the gate's GEMM is the router's
    with pytest.raises(KeyError, match="no op 'nope'"):
        models.shapes("nope", catalog)
    with pytest.raises(ValueError, match="layer 'mlp'"):
        OpDef("bad", "bad", args=("x", "w"), w_dtype=w_dtype, out_dtype="float32", fallback="f", max_m=1, min_n=1, max_n=1, min_k=1,
              max_k=1, threshold="box", grid=(), settings=(), layer="mlp", family=None, backward=None)


def test_shapes_per_rank_follow_the_published_configs(catalog: dict[str, models.Model]) -> None:
    gemv = models.origins("gemv", catalog)
    # Llama-3.1-70B at tp=8: q/k/v 10240/8, o_proj K 8192/8, gate_up 57344/8, down K 28672/8, LM head 128256/8
    for shape, layer in [((1, 1280, 8192), "qkv_proj"), ((1, 8192, 1024), "o_proj"), ((1, 7168, 8192), "mlp.gate_up_proj"),
                         ((1, 8192, 3584), "mlp.down_proj"), ((1, 16032, 8192), "lm_head")]:
        assert f"llama-3.1-70b tp=8 {layer}" in gemv[shape], (shape, layer)
    assert "llama-3.1-8b tp=1 mlp.down_proj" in gemv[(1, 4096, 14336)]  # the K = 14336 down projection
    assert "qwen3-32b tp=1 mlp.down_proj" in gemv[(1, 5120, 25600)]  # K = 25600: past the kernels' staging limit
    # DeepSeek-V3's MLA projections at tp=8
    assert "deepseek-v3 tp=8 kv_a_proj_with_mqa" in gemv[(1, 576, 7168)]
    assert "deepseek-v3 tp=8 q_b_proj" in gemv[(1, 3072, 1536)]
    router = models.origins("router_gemm", catalog)
    for m in models.ROUTER_M:
        assert "deepseek-v3 tp=8 router" in router[(m, 256, 7168)]
        assert "kimi-k2 tp=8 router" in router[(m, 384, 7168)]
    assert "mixtral-8x7b tp=2 router" in router[(1, 8, 4096)]
    assert "qwen3-30b-a3b tp=1 router" in router[(6, 128, 2048)]
    assert "gpt-oss-120b tp=1 router" in router[(1, 128, 2880)]
    assert models.origins("linear_bf16_fp32", catalog) == router  # the router's fp32 logits, either op
    # fp8: only models served with FP8 weights
    fp8 = models.origins("fp8_gemv", catalog)
    assert (1, 7168, 8192) in fp8 and not any("mixtral" in o for names in fp8.values() for o in names)


def test_shapes_are_sorted_and_distinct(catalog: dict[str, models.Model]) -> None:
    for op in OPS:
        s = models.shapes(op, catalog)
        assert s == sorted(set(s))


def test_select_and_model_grid(catalog: dict[str, models.Model]) -> None:
    assert sweep.model_grid("router_gemm", ["mixtral-8x7b"]) == [(m, 8, 4096) for m in models.ROUTER_M]
    with pytest.raises(SettingError, match="unknown model.*nope.*the catalog has: llama-3.1-8b"):
        models.select(catalog, ["nope"])


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "mine.toml"
    p.write_text(text)
    return p


def test_a_users_model_file_adds_shapes(tmp_path: Path) -> None:
    entry = BASE.replace("hidden = 64", "hidden = 3072") + "experts = 64\n"
    f = _write(tmp_path, '["my-moe"]\nsource = "https://example.org/config.json"\n' + entry)
    assert sweep.model_grid("router_gemm", ["my-moe"], [f]) == [(m, 64, 3072) for m in models.ROUTER_M]


BASE = 'hidden = 64\nheads = 4\nvocab = 100\ntp = [1]\n'
HEAD = '["m"]\nsource = "s"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEAD + BASE + 'hiden = 3\n', r"model 'm': unknown key\(s\) hiden; known keys"),
        (HEAD + BASE.replace("hidden = 64\n", ""), r"model 'm': missing hidden \(copy them from"),
        (HEAD + BASE.replace("[1]", "[]"), r"tp must be a non-empty list"),
        (HEAD + BASE.replace("64", "-64"), r"hidden must be a count >= 0, got -64"),
        (HEAD + BASE + 'attention = "mla"\n', r"an 'mla' model needs q_lora"),
        (HEAD + BASE.replace("[1]", "[3]"), r"tp=3 does not divide o_proj's K=64; drop that degree"),
        (HEAD + BASE + 'fp8 = "yes"\n', r"fp8 must be true or false"),
        ('["llama-3.1-8b"]\nsource = "s"\n' + BASE, r"model 'llama-3.1-8b' is already in .*models.toml"),
        ('m = 3\n', r"model 'm' is not a table"),
        ('[m\n', r"not valid TOML"),
    ],
)
def test_a_malformed_entry_is_refused_naming_the_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    f = _write(tmp_path, text)
    with pytest.raises(SettingError, match=message) as info:
        models.load([f])
    assert str(f) in str(info.value)


def test_a_missing_models_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="file not found; check the --models-file path"):
        models.load([tmp_path / "absent.toml"])
