"""Who serves each turbo flag on this machine: the `primus_turbo` package (AMD ROCm) when it imports, else this
project's own kernels (Triton, which targets CUDA and ROCm, and torch primitives).

    mapping = resolve_providers(cfg.turbo, cfg.precision, device=ctx.device, backend="megatron", moe=cfg.moe)
    log_providers(mapping)                      # one line per enabled flag, at start-up

A flag whose provider is missing here is a `ConfigError` naming what to install, never a silent no-op.
`capability_issues(cfg, device)` returns the same problems as `ConfigIssue`s for a backend's validation.

Cheap to import: no torch / triton import at module level (probing imports them lazily).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from primus.config.errors import ConfigError, ConfigIssue
from primus.features.precision import (  # noqa: F401 - the recipe table's answers, importable from here as before
    GPUS, PORTABLE_AMAX_ALGOS, PORTABLE_FP8_RECIPES, delayed_recipe_issues, gpu_has_fp8, te_available,
)
from primus.features.turbo import flags, sync_free_components

log = logging.getLogger("primus.turbo")

PRIMUS_TURBO = "primus_turbo"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@dataclass
class DeviceInfo:
    """What the providers depend on. `probe(device)` fills it; tests build one by hand."""
    kind: str  # "cpu", "cuda" (NVIDIA) or "rocm"
    name: str = ""
    capability: Tuple[int, int] = (0, 0)  # CUDA compute capability
    gcn_arch: str = ""  # ROCm, e.g. "gfx942"
    has_triton: bool = False
    triton_interpret: bool = False  # TRITON_INTERPRET=1 (CPU tests)
    has_primus_turbo: bool = False
    has_deep_ep: bool = False
    has_te: bool = False
    has_cudnn_sdpa: bool = False
    has_grouped_mm: bool = False  # torch._grouped_mm serves this device (CUDA sm90+)
    has_scaled_grouped_mm: bool = False
    has_symm_mem: bool = False  # torch.distributed._symmetric_memory (async TP)

    @property
    def fp8(self) -> bool:
        """fp8 tensor cores (features/precision.py: gpu_has_fp8)."""
        return gpu_has_fp8(self.kind, self.capability, self.gcn_arch)

    @property
    def gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

    @property
    def triton_runs(self) -> bool:
        return self.has_triton and (self.gpu or self.triton_interpret)


def device_info_for(device: str) -> DeviceInfo:
    """The DeviceInfo validation uses: probed on a GPU; on CPU built without importing torch (dry runs stay fast)."""
    if device != "cpu":
        return probe(device)
    return DeviceInfo(kind="cpu", has_triton=_importable("triton"),
                      triton_interpret=os.environ.get("TRITON_INTERPRET", "0") == "1",
                      has_primus_turbo=_importable(PRIMUS_TURBO), has_deep_ep=_importable("deep_ep"),
                      has_te=te_available())


def probe(device: str) -> DeviceInfo:
    """Inspect this machine for `device` ("cpu" or "cuda"; ROCm reports "cuda" in torch)."""
    import torch

    interp = os.environ.get("TRITON_INTERPRET", "0") == "1"
    info = DeviceInfo(kind="cpu", has_triton=_importable("triton"), triton_interpret=interp,
                      has_primus_turbo=_importable(PRIMUS_TURBO), has_deep_ep=_importable("deep_ep"),
                      has_te=te_available())
    info.has_symm_mem = _importable("torch.distributed._symmetric_memory")
    if str(device).startswith("cuda") and torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        info.name = props.name
        if torch.version.hip is not None:
            info.kind = "rocm"
            info.gcn_arch = getattr(props, "gcnArchName", "").split(":")[0]
        else:
            info.kind = "cuda"
            info.capability = torch.cuda.get_device_capability(idx)
            info.has_cudnn_sdpa = bool(torch.backends.cudnn.is_available()) and info.capability >= (8, 0)
            # torch._grouped_mm's CUTLASS kernels serve sm90 / sm100; _scaled_grouped_mm is sm90 (rowwise fp8)
            info.has_grouped_mm = hasattr(torch, "_grouped_mm") and info.capability[0] in (9, 10)
            info.has_scaled_grouped_mm = hasattr(torch, "_scaled_grouped_mm") and info.capability[0] == 9
    return info


# ---------------------------------------------------------------------------------------------------- resolution


def _fp8_on(precision_cfg) -> bool:
    return precision_cfg is not None and getattr(precision_cfg, "fp8", None) is not None


def _val(x) -> Any:
    return getattr(x, "value", x)


# turbo.provider's values: auto = primus_turbo when it imports, else this project's kernels ("own"; "triton" is
# its older name)
PROVIDERS = ("auto", PRIMUS_TURBO, "own", "triton")


def _want_primus_turbo(turbo_cfg, info: DeviceInfo) -> Tuple[bool, List[ConfigIssue]]:
    p = str(getattr(turbo_cfg, "provider", "auto") or "auto")
    if p == "auto":
        return info.has_primus_turbo, []
    if p == PRIMUS_TURBO:
        if not info.has_primus_turbo:
            return False, [ConfigIssue(["turbo.provider"], p, "the primus_turbo package does not import here",
                                       "install Primus-Turbo (AMD ROCm: pip install primus_turbo, or build "
                                       "github.com/AMD-AGI/Primus-Turbo), or set turbo.provider=auto")]
        return True, []
    return False, []  # own / triton (anything else is refused by the turbo feature's rule, before this runs)


def _enabled(turbo_cfg, precision_cfg, backend: str, moe_cfg=None) -> List[str]:
    """The config keys (group.field) that ask for a turbo / portable kernel path on this backend."""
    keys: List[str] = []
    if turbo_cfg is not None and getattr(turbo_cfg, "enable_primus_turbo", False):
        keys += [f"turbo.{f}" for f in flags("torchtitan" if backend == "torchtitan" else "megatron")
                 if getattr(turbo_cfg, f, False)]
        stage = int(getattr(turbo_cfg, "turbo_sync_free_moe_stage", 0) or 0)
        if stage > 0 and backend != "torchtitan":
            keys.append("turbo.turbo_sync_free_moe_stage")
    if moe_cfg is not None and getattr(moe_cfg, "moe_permute_fusion", False) and backend != "torchtitan":
        keys.append("moe.moe_permute_fusion")
    if backend != "torchtitan" and _fp8_on(precision_cfg):
        keys.append("precision.fp8")
    return keys


def _triton_missing(key: str, info: DeviceInfo) -> Optional[ConfigIssue]:
    if not info.has_triton:
        return ConfigIssue([key], True, "this flag's kernels are Triton kernels and triton does not import",
                           "pip install triton (CUDA) or pytorch-triton-rocm (ROCm), or turn the flag off")
    if not info.triton_runs:
        return ConfigIssue([key, "device"], "cpu", "Triton kernels need a GPU (CUDA or ROCm)",
                           "run on a GPU, turn the flag off on CPU (or TRITON_INTERPRET=1 for kernel tests only)")
    return None


def _fp8_missing(key: str, info: DeviceInfo) -> Optional[ConfigIssue]:
    if not info.fp8:
        what = info.name or info.kind
        return ConfigIssue([key, "device"], what,
                           "fp8 GEMMs need " + GPUS["fp8"]["words"],
                           "run on such a GPU, or use precision=bf16")
    return None


def _resolve(turbo_cfg, precision_cfg, info: DeviceInfo, backend: str, moe_cfg=None
             ) -> Tuple[Dict[str, str], List[ConfigIssue]]:
    backend = _val(backend)
    use_pt, issues = _want_primus_turbo(turbo_cfg, info)
    out: Dict[str, str] = {}
    fp8 = _fp8_on(precision_cfg)
    recipe = _val(getattr(precision_cfg, "fp8_recipe", "tensorwise")) if fp8 else None

    def need(issue):
        if issue is not None:
            issues.append(issue)
            return False
        return True

    for key in _enabled(turbo_cfg, precision_cfg, backend, moe_cfg):
        flag = key.split(".", 1)[1]
        if flag == "use_turbo_deepep":
            if use_pt:
                out[key] = "primus_turbo.deepep"
            elif info.has_deep_ep:
                out[key] = "deep_ep"
            else:
                issues.append(ConfigIssue([key], True, "DeepEP does not import here (neither deep_ep nor primus_turbo)",
                                          "install DeepEP (github.com/deepseek-ai/DeepEP; ROCm: Primus-Turbo ships it), "
                                          "or set turbo.use_turbo_deepep=false and moe.moe_token_dispatcher_type=alltoall"))
            continue
        if flag == "turbo_sync_free_moe_stage":
            stage = int(turbo_cfg.turbo_sync_free_moe_stage)
            out[key] = f"stage {stage}: " + ", ".join(words for _, words in sync_free_components(stage))
            continue
        if flag == "fp8":
            if info.has_te and backend == "megatron":
                out[key] = "transformer_engine"
            elif need(_fp8_missing(key, info)) and need(_triton_missing(key, info)):
                out[key] = f"own: torch._scaled_mm + triton cast kernels ({recipe})"
                if recipe not in PORTABLE_FP8_RECIPES:
                    issues.append(ConfigIssue(["precision.fp8_recipe"], recipe,
                                              "without Transformer Engine the fp8 linear runs the recipes "
                                              f"{list(PORTABLE_FP8_RECIPES)}",
                                              "set precision.fp8_recipe to one of those, or install Transformer Engine"))
            continue
        if use_pt and flag != "moe_permute_fusion":
            out[key] = f"primus_turbo ({flag})"
            continue
        if flag == "use_turbo_attention":
            if info.kind == "cuda":
                out[key] = "torch SDPA (cuDNN backend)" if info.has_cudnn_sdpa else "torch SDPA (flash backend)"
            elif info.kind == "rocm":
                out[key] = "torch SDPA (flash backend: AOTriton/CK)"
            else:
                out[key] = "torch SDPA (CPU flash backend)"
        elif flag in ("use_turbo_rms_norm", "use_turbo_fused_act_with_probs", "moe_use_fused_router_with_aux_score",
                      "moe_permute_fusion"):
            if need(_triton_missing(key, info)):
                out[key] = "own: triton"
        elif flag == "use_turbo_parallel_linear":
            gemm = "torch._scaled_mm fp8 (%s)" % recipe if fp8 else "torch.mm bf16 (cuBLAS/hipBLASLt)"
            if fp8 and not (need(_fp8_missing(key, info)) and need(_triton_missing(key, info))):
                continue
            out[key] = f"own: {gemm} + async TP collectives overlapped with chunked GEMMs"
        elif flag == "use_turbo_grouped_gemm":
            # under fp8 the experts run bf16 unless turbo.grouped_gemm_fp8 (grouped_gemm_fp8.py's rule picks the
            # GEMM; backend_info.fp8_experts records the run's answer); the log says which
            note = ""
            if fp8 and getattr(turbo_cfg, "grouped_gemm_fp8", False):
                fmt = _val(getattr(precision_cfg, "fp8", None))
                gg = ("torch._scaled_grouped_mm rowwise e4m3" if info.has_scaled_grouped_mm and fmt == "e4m3" else
                      "triton tensorwise")
                note = f" (experts in fp8: {gg})"
            elif fp8:
                note = " (experts stay bf16 under fp8: turbo.grouped_gemm_fp8=true runs them in fp8)"
            if info.has_grouped_mm:
                out[key] = "own: torch._grouped_mm (bf16)" + note
            elif need(_triton_missing(key, info)):
                out[key] = "own: triton grouped GEMM (bf16)" + note
        elif flag == "use_turbo_float8_linear":
            if need(_fp8_missing(key, info)) and need(_triton_missing(key, info)):
                r = recipe or "tensorwise"
                out[key] = f"own: FP8Linear (torch._scaled_mm + triton casts, {r})"
        elif flag == "use_turbo_async_tp":
            if not info.gpu:
                issues.append(ConfigIssue([key, "device"], "cpu", "async TP overlaps NCCL/RCCL collectives with GEMMs",
                                          "run on GPUs, or set turbo.use_turbo_async_tp=false"))
            elif info.has_symm_mem:
                out[key] = "torch symmetric-memory async TP (fused all-gather/reduce-scatter matmul)"
            else:
                issues.append(ConfigIssue([key], True, "torch.distributed._symmetric_memory is missing in this torch",
                                          "install torch >= 2.6, or set turbo.use_turbo_async_tp=false"))
        else:  # pragma: no cover - every flag is handled above
            issues.append(ConfigIssue([key], True, "no provider known for this flag", "turn it off"))
    return out, issues


def capability_issues(cfg, device: str, info: Optional[DeviceInfo] = None) -> List[ConfigIssue]:
    """Problems with the turbo / fp8 kernel providers for this config on this device, as ConfigIssues."""
    info = info or probe(device)
    _, issues = _resolve(getattr(cfg, "turbo", None), getattr(cfg, "precision", None), info,
                         _val(cfg.backend.name), getattr(cfg, "moe", None))
    return issues


def resolve_providers(turbo_cfg, precision_cfg, device: str, backend: str, moe_cfg=None,
                      info: Optional[DeviceInfo] = None) -> Dict[str, str]:
    """{config key: provider} for every enabled flag; raises ConfigError naming what to install when one is missing."""
    info = info or probe(device)
    mapping, issues = _resolve(turbo_cfg, precision_cfg, info, backend, moe_cfg)
    if issues:
        raise ConfigError(issues)
    return mapping


def log_providers(mapping: Dict[str, str], logger: Optional[logging.Logger] = None) -> List[str]:
    """Log (and return) one line per enabled flag: `turbo: <key> -> <provider>`."""
    lg = logger or log
    lines = [f"turbo: {k} -> {v}" for k, v in mapping.items()]
    if not lines:
        lines = ["turbo: no turbo / portable-kernel flag enabled"]
    for ln in lines:
        lg.info(ln)
    return lines
