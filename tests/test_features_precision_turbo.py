"""The data tables of the precision and turbo features (which recipe runs where, which turbo flag serves which
backend, the sync-free MoE stages) agree with the dataclasses, the presets and the installed libraries, and every
rule reads its answer from them."""
import dataclasses
import inspect
import typing

import pytest

from conftest import compose_cfg
from primus.config.errors import ConfigError
from primus.config.validate import validate
from primus.context import RunContext
from primus.features import precision, turbo
from primus.turbo.providers import DeviceInfo, _enabled, device_info_for

PLANNED = RunContext(device="cuda", world_size=1, run_dir="/tmp/r", planned=True)
GPU = RunContext(device="cuda", world_size=1, run_dir="/tmp/r")

# TurboConfig booleans that are not feature flags: the master switch, an option of use_turbo_grouped_gemm, the
# alias of use_turbo_parallel_linear, the removed flag and a DeepEP setting
NOT_FLAGS = {"enable_primus_turbo", "grouped_gemm_fp8", "use_turbo_gemm", "use_turbo_grouped_mlp",
             "turbo_deepep_use_comm_stream"}


# ------------------------------------------------------------------------------------------- turbo flags


def test_every_turbo_flag_has_one_row_and_every_row_a_flag():
    fields = {f.name for f in dataclasses.fields(turbo.TurboConfig)
              if f.type in (bool, "bool", "Optional[bool]") and f.name not in NOT_FLAGS}
    assert fields == set(turbo.TURBO_FLAGS)
    for flag, (backends, moe_only, swap) in turbo.TURBO_FLAGS.items():
        assert backends and set(backends) <= {"megatron", "torchtitan"}, flag
        assert isinstance(moe_only, bool) and isinstance(swap, bool), flag
        assert not swap or "megatron" in backends, flag  # a local-spec swap is megatron's


@pytest.mark.parametrize("backend", ["megatron", "torchtitan"])
def test_the_providers_resolve_exactly_the_backends_flags(backend):
    t = turbo.TurboConfig(enable_primus_turbo=True, **{f: True for f in turbo.TURBO_FLAGS})
    assert _enabled(t, None, backend) == [f"turbo.{f}" for f in turbo.flags(backend)]


def test_megatron_turbo_args_carry_its_flags_and_drop_moe_ones_on_a_dense_model():
    on = [f"turbo.{f}=true" for f in turbo.flags("megatron")]
    moe = turbo.turbo_args(compose_cfg(["model=debug_moe", "turbo.enable_primus_turbo=true"] + on))
    dense = turbo.turbo_args(compose_cfg(["turbo.enable_primus_turbo=true"] + on))
    assert set(turbo.flags("megatron")) <= set(moe)
    assert set(turbo.flags("megatron")) & set(dense) == set(turbo.flags("megatron", moe_only=False))


def test_the_dense_model_rule_lists_the_moe_only_flags():
    on = [f"turbo.{f}=true" for f in turbo.flags(moe_only=True)]
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(["turbo.enable_primus_turbo=true"] + on), PLANNED)
    # DeepEP on a dense model is an error (its own rule); the other MoE-only flags are a warning, listed together
    named = {k for i in e.value.issues for k in i.keys}
    assert "turbo.use_turbo_deepep" in named
    ctx = RunContext(device="cuda", world_size=1, run_dir="/tmp/r", planned=True)
    validate(compose_cfg(["turbo.enable_primus_turbo=true"] + [o for o in on if "deepep" not in o]), ctx)
    warned = {k for i in ctx.warnings for k in i.keys}
    assert {f"turbo.{f}" for f in turbo.flags(moe_only=True) if f != "use_turbo_deepep"} <= warned


@pytest.mark.parametrize("stage", sorted(turbo.SYNC_FREE_STAGES))
def test_each_sync_free_preset_sets_the_components_of_its_stage(stage):
    cfg = compose_cfg(["model=debug_moe", f"turbo=sync_free_stage{stage}"])
    assert cfg.turbo.turbo_sync_free_moe_stage == stage
    wanted = {k for k, _ in turbo.sync_free_components(stage)}
    later = {k for s, comps in turbo.SYNC_FREE_STAGES.items() if s > stage for k, _ in comps} - wanted
    assert all(turbo._get(cfg, k) is True for k in wanted)
    assert not any(turbo._get(cfg, k) for k in later if k.startswith("turbo."))
    validate(cfg, PLANNED)  # and the rule, reading the same table, accepts it


def test_a_missing_sync_free_component_is_named():
    with pytest.raises(ConfigError, match="turbo.use_turbo_deepep"):
        validate(compose_cfg(["model=debug_moe", "turbo=sync_free_stage2", "turbo.use_turbo_deepep=false",
                              "moe.moe_token_dispatcher_type=alltoall"]), PLANNED)


# ------------------------------------------------------------------------------------------- recipes


def test_the_megatron_rows_are_the_recipes_megatron_core_accepts():
    mcore = pytest.importorskip("megatron.core.transformer.transformer_config")
    hints = typing.get_type_hints(mcore.TransformerConfig)
    for fmt, field in (("fp8", "fp8_recipe"), ("fp4", "fp4_recipe")):
        literal = [a for a in typing.get_args(hints[field]) if typing.get_origin(a) is typing.Literal][0]
        assert set(precision.recipes(fmt, backend="megatron")) == set(typing.get_args(literal)) - {"custom"}


def test_every_recipe_of_the_schema_runs_somewhere_and_every_row_names_a_known_gpu_class():
    assert {r for _, r, *_ in precision.RECIPES} == {r.value for r in precision.FP8Recipe} | {"nvfp4"}
    assert {g for *_, g in precision.RECIPES} <= set(precision.GPUS)
    assert precision.PORTABLE_FP8_RECIPES == ("tensorwise", "delayed", "rowwise", "blockwise")


def test_torchtitan_runs_mxfp8_through_torchao_mx_on_mx_gpus():
    """torchtitan 0.2.2 maps precision=mxfp8 to its quantize.linear.mx converter (torchao's MX linear), which asserts
    CUDA sm100+ or ROCm gfx950+: the table says so, a dry run accepts it, a GPU without MX GEMMs is refused."""
    assert precision.recipe_gpus("fp8", "mxfp8", "torchtitan", "torchao") == "mx"
    cfg = compose_cfg(["backend=torchtitan", "precision=mxfp8"])
    validate(cfg, PLANNED)
    from primus.backends.torchtitan.args import build_args

    args = build_args(cfg, PLANNED)
    assert args["model"]["converters"] == ["quantize.linear.mx"]
    assert args["quantize"]["linear"]["mx"]["recipe_name"] == "mxfp8_cublas"
    # the turbo fp8 linear has no MX path
    with pytest.raises(ConfigError, match="mxfp8"):
        validate(compose_cfg(["backend=torchtitan", "precision=mxfp8", "turbo=torchtitan_fp8"]), PLANNED)


def test_the_installed_torchtitan_mx_converter_needs_the_gpus_of_the_table():
    mx = pytest.importorskip("torchtitan.components.quantization.mx")
    src = inspect.getsource(mx.MXLinearConverter.__init__)
    assert "has_cuda_capability(10, 0)" in src and "has_rocm_capability(" in src and "9, 5" in src.replace("\n", " ")
    assert precision.GPUS["mx"]["cuda"] == (10, 0) and precision.GPUS["mx"]["rocm"] == ("gfx95",)


@pytest.mark.parametrize("backend", ["megatron", "torchtitan"])
@pytest.mark.parametrize("gpu, ok", [(("cuda", (9, 0), "", "NVIDIA H100"), False),
                                     (("cuda", (10, 0), "", "NVIDIA B200"), True),
                                     (("rocm", (0, 0), "gfx942", "MI300X"), False),
                                     (("rocm", (0, 0), "gfx950", "MI355X"), True)])
def test_mxfp8_on_a_gpu_without_mx_gemms_is_an_issue(monkeypatch, backend, gpu, ok):
    monkeypatch.setattr(precision, "this_gpu", lambda index=0: gpu)
    monkeypatch.setattr(precision, "fp8_backend", lambda cfg: "te")  # megatron's mxfp8 is TE's
    found = precision.gpu_issues(compose_cfg([f"backend={backend}", "precision=mxfp8"]), GPU)
    assert (found == []) == ok, found
    assert ok or "MX" in str(found[0])


# ------------------------------------------------------------------------------------------- one answer per fact


@pytest.mark.parametrize("kind, cap, arch, fp8", [
    ("cuda", (8, 0), "", False), ("cuda", (8, 9), "", True), ("cuda", (9, 0), "", True), ("cuda", (10, 0), "", True),
    ("rocm", (0, 0), "gfx90a", False), ("rocm", (0, 0), "gfx942", True), ("rocm", (0, 0), "gfx950", True),
    ("rocm", (0, 0), "gfx1201", True), ("rocm", (0, 0), "gfx1100", False), ("cpu", (0, 0), "", False),
])
def test_which_gpus_have_fp8_has_one_answer(kind, cap, arch, fp8):
    assert precision.gpu_has_fp8(kind, cap, arch) is fp8
    assert DeviceInfo(kind=kind, capability=cap, gcn_arch=arch).fp8 is fp8


def test_an_older_rocm_gpu_gets_no_fp8_on_megatron(monkeypatch):
    """megatron used to take any ROCm GPU for an fp8 one; MI250 (gfx90a) has no fp8 tensor cores."""
    monkeypatch.setattr(precision, "this_gpu", lambda index=0: ("rocm", (0, 0), "gfx90a", "AMD Instinct MI250X"))
    found = precision.gpu_issues(compose_cfg(["precision=fp8"]), GPU)
    assert found and "no fp8 tensor cores" in str(found[0]) and "MI250X" in str(found[0])


def test_transformer_engine_availability_has_one_answer():
    assert device_info_for("cpu").has_te is precision.te_available()
    from primus.backends.megatron import args as margs

    assert margs.te_available is precision.te_available
