"""Grouped GEMM for megatron-core's GroupedMLP without Transformer Engine or the `grouped_gemm` package.

megatron-core 0.16.1 runs `moe_grouped_gemm` through TE's TEGroupedMLP or, in the local spec, through GroupedMLP,
which calls `grouped_gemm.ops.gmm(a, b, batch_sizes, trans_b)` from the separate `grouped_gemm` package. When that
package is absent, this module answers the same call with torch's own grouped matmul (`torch._grouped_mm`, one
kernel over all experts on sm90+ GPUs, with autograd) and, elsewhere (CPU, older GPUs, unaligned shapes), with one
matmul per expert: the same numbers, slower.

Applied on another megatron-core version too (with the registry's warning): it fills a slot megatron leaves empty
(`grouped_gemm_util.grouped_gemm is None`) and touches nothing when the package is there; a changed call
contract fails loudly at the first MoE forward rather than computing something else.
"""
from __future__ import annotations

import logging
import types

import torch

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.registry import Conditions, Workaround, pin

log = logging.getLogger("primus.megatron")


def _torch_grouped_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not (a.is_cuda and hasattr(torch, "_grouped_mm") and a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16):
        return False
    if torch.version.hip is None and torch.cuda.get_device_capability(a.device) < (9, 0):
        return False
    # operands must be 16-byte aligned along the reduced and output dims
    return a.shape[-1] % 8 == 0 and b.shape[-1] % 8 == 0 and b.shape[-2] % 8 == 0


_torch_path = {"state": "untried"}  # untried -> ok | column_major | failed (decided on the first call, on the GPU)


def _per_expert(a, b, batch_sizes):
    sizes = [int(n) for n in batch_sizes.tolist()]
    outs = [x @ b[e] for e, x in enumerate(torch.split(a, sizes, dim=0))]
    return torch.cat(outs, dim=0) if outs else a.new_empty(0, b.shape[-1])


def gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor, trans_b: bool = False) -> torch.Tensor:
    """rows of `a` grouped by expert (`batch_sizes[e]` rows for expert e) times `b[e]` ([E, K, N], or [E, N, K]
    with trans_b)."""
    if trans_b:
        b = b.transpose(-1, -2)
    if _torch_path["state"] != "failed" and _torch_grouped_ok(a, b):
        offs = torch.cumsum(batch_sizes.to(device=a.device), 0, dtype=torch.int32)
        if _torch_path["state"] == "column_major":
            b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        try:
            out = torch._grouped_mm(a, b, offs=offs)
            if _torch_path["state"] == "untried":
                _torch_path["state"] = "ok"
            return out
        except RuntimeError as e:
            # some torch builds want mat_b column-major; untested layouts fall back rather than stop training
            if _torch_path["state"] == "untried":
                _torch_path["state"] = "column_major"
                log.warning("torch._grouped_mm refused row-major expert weights (%s); retrying column-major", e)
                return gmm(a, b, batch_sizes)
            _torch_path["state"] = "failed"
            log.warning("torch._grouped_mm unavailable (%s): one matmul per expert", e)
    return _per_expert(a, b, batch_sizes)


def path() -> str:
    """Which kernel the grouped GEMM used (for the log / result.json)."""
    return {"ok": "torch._grouped_mm", "column_major": "torch._grouped_mm (column-major weights)",
            "failed": "per-expert matmul"}.get(_torch_path["state"], "per-expert matmul")


def install(_cond: Conditions = None) -> bool:
    """Point megatron's grouped_gemm_util at `gmm` when the grouped_gemm package is missing. Returns whether it
    did."""
    from megatron.core.transformer.moe import grouped_gemm_util as gg

    if gg.grouped_gemm is not None:
        return False
    ops = types.SimpleNamespace(gmm=gmm)
    gg.grouped_gemm = types.SimpleNamespace(ops=ops, __name__="primus.backends.megatron.grouped_gemm")
    gg.ops = ops
    return True


def _local_grouped_mlp(cond: Conditions) -> bool:
    """The local spec builds GroupedMLP: an MoE model with moe_grouped_gemm, without Transformer Engine layers."""
    tc = cond.args.get("transformer_config", {})
    return cond.args.get("layer_spec") != "te" and bool(tc.get("num_moe_experts")) and bool(tc.get("moe_grouped_gemm"))


WORKAROUNDS = (
    Workaround(
        "megatron.moe.grouped_gemm_fallback",
        "megatron.core.transformer.moe.grouped_gemm_util.grouped_gemm / .ops (GroupedMLP's gmm)",
        "without the separate grouped_gemm package GroupedMLP has no GEMM to call and fails to build",
        (pin("megatron-core", PINNED_MCORE),),
        "MoE with moe.moe_grouped_gemm=true on the local spec (no Transformer Engine), grouped_gemm package absent",
        _local_grouped_mlp, install, every_run=True),
)
