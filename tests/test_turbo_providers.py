"""Provider resolution: primus_turbo when it imports, own Triton/torch kernels otherwise, errors naming installs."""
import logging

import pytest

from primus.config.errors import ConfigError
from primus.config.schema import FP8Format, FP8Recipe, MoEConfig, PrecisionConfig, TurboConfig
from primus.turbo.providers import DeviceInfo, log_providers, resolve_providers

H200 = DeviceInfo(kind="cuda", name="H200", capability=(9, 0), has_triton=True, has_cudnn_sdpa=True,
                  has_grouped_mm=True, has_scaled_grouped_mm=True, has_symm_mem=True)
A100 = DeviceInfo(kind="cuda", name="A100", capability=(8, 0), has_triton=True, has_cudnn_sdpa=True)
MI300 = DeviceInfo(kind="rocm", name="MI300X", gcn_arch="gfx942", has_triton=True)
CPU = DeviceInfo(kind="cpu", has_triton=True)


def _turbo(**kw):
    return TurboConfig(enable_primus_turbo=True, **kw)


def test_own_providers_on_h200():
    t = _turbo(use_turbo_rms_norm=True, use_turbo_attention=True, use_turbo_grouped_gemm=True,
               use_turbo_parallel_linear=True, use_turbo_fused_act_with_probs=True,
               moe_use_fused_router_with_aux_score=True)
    m = resolve_providers(t, PrecisionConfig(), "cuda", "megatron", MoEConfig(moe_permute_fusion=True), info=H200)
    assert m["turbo.use_turbo_rms_norm"] == "own: triton"
    assert "cuDNN" in m["turbo.use_turbo_attention"]
    assert "torch._grouped_mm" in m["turbo.use_turbo_grouped_gemm"]
    assert m["moe.moe_permute_fusion"] == "own: triton"
    lines = log_providers(m, logging.getLogger("t"))
    assert len(lines) == len(m)


def test_fp8_experts_note_names_the_grouped_gemm():
    """Under fp8 the grouped-GEMM line says what the experts run: bf16 unless turbo.grouped_gemm_fp8, then
    torch._scaled_grouped_mm for e4m3 where it serves (sm90), else the Triton kernels (hybrid: e5m2 gradients)."""
    def note(fmt, fp8_experts, info=H200):
        t = _turbo(use_turbo_grouped_gemm=True, grouped_gemm_fp8=fp8_experts)
        return resolve_providers(t, PrecisionConfig(fp8=FP8Format(fmt)), "cuda", "megatron",
                                 info=info)["turbo.use_turbo_grouped_gemm"]

    assert "experts in fp8: torch._scaled_grouped_mm rowwise e4m3" in note("e4m3", True)
    assert "experts in fp8: triton tensorwise" in note("hybrid", True)
    b200 = DeviceInfo(kind="cuda", name="B200", capability=(10, 0), has_triton=True, has_grouped_mm=True)
    assert "experts in fp8: triton tensorwise" in note("e4m3", True, info=b200)  # the CUTLASS kernel is sm90-only
    assert "experts stay bf16 under fp8" in note("e4m3", False)


def test_rocm_without_primus_turbo_uses_triton():
    m = resolve_providers(_turbo(use_turbo_grouped_gemm=True, use_turbo_attention=True), None, "cuda", "megatron",
                          info=MI300)
    assert "triton" in m["turbo.use_turbo_grouped_gemm"] and "flash" in m["turbo.use_turbo_attention"]


def test_primus_turbo_preferred_when_it_imports():
    info = DeviceInfo(**{**MI300.__dict__, "has_primus_turbo": True})
    m = resolve_providers(_turbo(use_turbo_rms_norm=True, use_turbo_deepep=True), None, "cuda", "megatron", info=info)
    assert m["turbo.use_turbo_rms_norm"].startswith("primus_turbo")
    assert m["turbo.use_turbo_deepep"] == "primus_turbo.deepep"


def test_missing_providers_are_errors():
    with pytest.raises(ConfigError, match="DeepEP"):
        resolve_providers(_turbo(use_turbo_deepep=True), None, "cuda", "megatron", info=H200)
    with pytest.raises(ConfigError, match="need a GPU"):
        resolve_providers(_turbo(use_turbo_rms_norm=True), None, "cpu", "megatron", info=CPU)
    with pytest.raises(ConfigError, match="pip install triton"):
        resolve_providers(_turbo(use_turbo_rms_norm=True), None, "cuda", "megatron",
                          info=DeviceInfo(**{**H200.__dict__, "has_triton": False}))
    fp8 = PrecisionConfig(fp8=FP8Format.e4m3, fp8_recipe=FP8Recipe.tensorwise)
    with pytest.raises(ConfigError, match="8.9"):
        resolve_providers(TurboConfig(), fp8, "cuda", "megatron", info=A100)
    with pytest.raises(ConfigError, match="primus_turbo"):
        resolve_providers(_turbo(provider="primus_turbo", use_turbo_rms_norm=True), None, "cuda", "megatron",
                          info=H200)


def test_fp8_without_te_and_torchtitan_flags():
    fp8 = PrecisionConfig(fp8=FP8Format.hybrid, fp8_recipe=FP8Recipe.rowwise)
    m = resolve_providers(TurboConfig(), fp8, "cuda", "megatron", info=H200)
    assert "torch._scaled_mm" in m["precision.fp8"] and "rowwise" in m["precision.fp8"]
    m = resolve_providers(_turbo(use_turbo_float8_linear=True, use_turbo_async_tp=True, use_turbo_attention=True),
                          fp8, "cuda", "torchtitan", info=H200)
    assert set(m) == {"turbo.use_turbo_float8_linear", "turbo.use_turbo_async_tp", "turbo.use_turbo_attention"}
    m = resolve_providers(TurboConfig(), PrecisionConfig(fp8=FP8Format.e4m3, fp8_recipe=FP8Recipe.delayed), "cuda",
                          "megatron", info=H200)
    assert "delayed" in m["precision.fp8"]  # the portable DelayedScaling
    with pytest.raises(ConfigError, match="mxfp8"):
        resolve_providers(TurboConfig(), PrecisionConfig(fp8=FP8Format.e4m3, fp8_recipe=FP8Recipe.mxfp8), "cuda",
                          "megatron", info=H200)


def test_nothing_enabled():
    assert resolve_providers(TurboConfig(), PrecisionConfig(), "cpu", "megatron", info=CPU) == {}
