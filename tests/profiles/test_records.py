"""Public records are slotted, frozen value objects, not tuples; Profile.get is typed and checked."""

from __future__ import annotations

import pickle

import pytest

import hwprofile
from hwprofile import (
    ArchSpec,
    DeviceInfo,
    EnvDefault,
    KernelSpec,
    Launch,
    PluginInfo,
    Setting,
    Value,
    _deps,
    _env,
    catalog,
    costmodel,
    models,
)
from hwprofile._entrypoints import EntryPoint
from hwprofile._record import Record
from hwprofile._verdicts import Outcome
from hwprofile.device import Detection, DriverAttributes, _Raw
from hwprofile.distributed._compare import Difference, Holding
from hwprofile.distributed._summary import Entry
from hwprofile.errors import SettingError
from hwprofile.kernels.limits import TABLE as LIMITS
from hwprofile.kernels.spec import parse_options
from hwprofile.kernels.toolchain import CompiledKernel, CompileOptions
from hwprofile.ops._warmup import Planned
from hwprofile.optable import Router
from hwprofile.plugin import ArchTuning, Stamp
from hwprofile.registry import Selection
from hwprofile.retune import Finding, Plan
from hwprofile.selftest import Case
from hwprofile.settings import Layer, ResolvedEnvDefault, ResolvedSetting
from hwprofile.tuning import Comparison, Measured

SETTING = Setting("x.y", "int", 1, "doc", minimum=0, maximum=4)
SAMPLES: list[Record] = [
    DeviceInfo(0, "NVIDIA H200", (9, 0), simulated=True),
    parse_options(("-I/a", "-include", "/b/pre.h", "-DX=1")),
    Router("deepseek-v3", 256, 7168, top_k=8, n_group=8, topk_group=4, scaling=2.5),
    DriverAttributes(132, 227 * 1024, 50 << 20),
    Detection((DeviceInfo(0, "NVIDIA H200", (9, 0)),)),
    ArchSpec({(9, 0): "sm_90a"}, "Hopper"),
    PluginInfo("sm90", "hwprofile-sm90", "0.1.0", "hwprofile_sm90"),
    Selection(None, None, "no plugin"),
    SETTING,
    Value(3, "why"),
    EnvDefault("1", "why"),
    Layer("arch", "hwprofile-sm90 0.1.0", 3),
    ResolvedSetting(SETTING, (Layer("core", "hwprofile core", 1),)),
    ResolvedEnvDefault("A", "1", "why", True, "p"),
    Launch("k<1>", (1, 1, 1), (32, 1, 1)),
    KernelSpec("op", "pkg", "k.cu", ("k<1>",), print),
    Stamp("router_gemm", "NVIDIA H200 sm_90 140 GiB", (9, 0), "sm90", "0.1.0", "ab" * 32, {"function": "f", "torch": "2.11.0"}),
    ArchTuning(sm_count=132, max_shared_bytes=227 * 1024),
    # the value records that were NamedTuples, frozen dataclasses or slotted classes before issue 42
    costmodel.Sample(1, 4096, 7168, 2.5, 3.0),
    costmodel.Prediction(2.0, 3.0, ((1, 4096, 7168),)),
    costmodel.VariantChoice("split", 1.0, ()),
    costmodel.Held("m", 1, 4096, 7168, 2.5, 3.0, 2.4, 3.1),
    costmodel.CostModel("gemv", None, costmodel.PathFit(2.6, ((20, 0.8), (24, 3.2)))),
    LIMITS[(9, 0)],
    _deps.DEPENDENCIES["pluggy"],
    catalog.CATALOG["h200"],
    EntryPoint("sm90", "hwprofile_sm90.plugin", "hwprofile-sm90", "0.1.0"),
    Measured(True, 2.0, 3.0, "split"),
    Comparison(("kernel source changed",)),
    _Raw(DeviceInfo(0, "NVIDIA H200", (9, 0)), 16896),
    Plan(0, "NVIDIA H200 sm_90 140 GiB", (Finding("gemv", "changed", ("why",)),), {"gemv": ((1, 4096, 4096),)}, 4.8e12),
    Case("gemv", (1, 4096, 4096), 0, Launch("k<1>", (1, 1, 1), (32, 1, 1))),
    Outcome(False, 0.5, "too far"),
    Planned("gemv", (1, 4096, 4096), 0, "kernel", "below the threshold"),
    CompileOptions("sm_90a", ("/include",), parse_options(("-O3",))),
    CompiledKernel("ab" * 32, "sm_90a", b"\x7fELF", {"k<1>": "_Z1kILi1EEvv"}),
    Holding("16", ("hwprofile-sm90",), (0, 1), {"host": (0, 1)}),
    Difference("gemv.split_k", "job", (Holding("true", ("env",), (0,), {"a": (0,)}),)),
    Entry("16", "hwprofile-sm90 0.1.0", "job"),
    models.load()["llama-3.1-8b"],
    _env.CACHE,
]


@pytest.mark.parametrize("rec", SAMPLES, ids=lambda r: type(r).__name__)
def test_record_is_not_a_tuple(rec: Record) -> None:
    assert not isinstance(rec, tuple)
    with pytest.raises(TypeError):
        len(rec)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rec[0]  # type: ignore[index]
    assert not hasattr(rec, "__dict__")  # slots only


@pytest.mark.parametrize("rec", SAMPLES, ids=lambda r: type(r).__name__)
def test_record_is_a_frozen_value(rec: Record) -> None:
    field = rec.__record_fields__[0]
    with pytest.raises(AttributeError, match="frozen"):
        setattr(rec, field, None)
    with pytest.raises(AttributeError, match="frozen"):
        delattr(rec, field)
    copy = rec.replace()
    assert copy == rec and copy is not rec and hash(copy) == hash(rec)
    assert pickle.loads(pickle.dumps(rec)) == rec
    if type(rec).__repr__ is Record.__repr__:  # _env.Var keeps its short form: <Var HWPROFILE_CACHE>
        fields = ", ".join(f"{f}={getattr(rec, f)!r}" for f in rec.__record_fields__)
        assert repr(rec) == f"{type(rec).__name__}({fields})"


def test_replace_changes_one_field_and_rechecks() -> None:
    d = DeviceInfo(0, "NVIDIA H200", (9, 0))
    d1 = d.replace(index=1)
    assert (d1.index, d1.name, d.index) == (1, "NVIDIA H200", 0) and d1 != d
    with pytest.raises(TypeError, match="no field"):
        d.replace(idx=1)
    with pytest.raises(SettingError, match="invalid"):
        SETTING.replace(default=9)  # the constructor checks the copy as it checks any value


def test_equality_needs_the_same_type() -> None:
    assert EnvDefault("1", "r") != Value("1", "r")
    assert DeviceInfo(0, "a", (9, 0)) != (0, "a", (9, 0))


def test_profile_get_is_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    prof = hwprofile.profile(0)
    n: int = prof.get("router_gemm.max_tokens", int)
    assert n == prof["router_gemm.max_tokens"] == prof.get_int("router_gemm.max_tokens")
    assert prof.get_bool("gemv.split_k") is prof["gemv.split_k"]
    with pytest.raises(SettingError, match=r"gemv.split_k is declared 'bool'.*not int"):
        prof.get("gemv.split_k", int)  # a bool is not silently an int
    with pytest.raises(SettingError, match="declared 'int'.*not str"):
        prof.get_str("router_gemm.max_tokens")
    with pytest.raises(SettingError, match="unknown setting"):
        prof.get("no.such", int)


def test_profile_is_compared_by_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    a = hwprofile.profile(0)
    hwprofile.reset()
    b = hwprofile.profile(0)
    assert a is not b and a != b and a.fingerprint == b.fingerprint and {a: 1}[a] == 1
    with pytest.raises(AttributeError, match="frozen"):
        a.fingerprint = "x"  # type: ignore[misc]
    assert a.fingerprint in repr(a)


def test_a_read_only_mapping_field_is_read_only_after_pickling() -> None:
    """mappingproxy does not pickle: it travels as a dict and is read-only again on arrival, __post_init__ or not."""
    from types import MappingProxyType

    spec = ArchSpec(MappingProxyType({(9, 0): "sm_90a"}), "Hopper")
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and isinstance(back.targets, MappingProxyType)
    with pytest.raises(TypeError):
        back.targets[(9, 0)] = "sm_90"  # type: ignore[index]
    plain = ArchSpec({(9, 0): "sm_90a"})  # a plain dict stays what it was
    assert type(pickle.loads(pickle.dumps(plain)).targets) is dict
