"""training.gradient_accumulation_fusion on megatron-core's local spec without apex.

megatron-core 0.16.1's local linears (LinearWithGradAccumulationAndAsyncCommunication) fuse the weight gradient
into the fp32 `main_grad` only through apex's
`fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(input, grad_output, main_grad)`; without apex, megatron refuses
the setting when it builds a linear. Unfused, each micro batch writes a bf16 weight gradient and DDP's hook then adds
it into `main_grad` (10 bytes a parameter a micro batch, its own kernel; estimated at 5% of a Llama-3.1-8B
micro batch on an H200, 80 GB of traffic beside about 0.37 s of GEMMs, not measured). This module gives megatron
the same two functions as torch ops:
  - fp32 main_grad, CUDA: one cuBLAS GEMM that reads the bf16 operands and accumulates into `main_grad` in place
    (`torch.addmm(..., out_dtype=torch.float32, out=main_grad)`), checked once per process against the unfused sum
    on a small problem; where that op is missing or disagrees, the unfused sum (the same cost as no fusion, logged);
  - fp32 main_grad elsewhere (CPU): `main_grad.addmm_` on the operands cast to fp32 (fp32 products and sums, as
    the fused kernel);
  - bf16 / fp16 main_grad: `main_grad.addmm_` in that dtype.
megatron then gives the weight a placeholder gradient and marks it `grad_added_to_main_grad`, as with apex.

Under training.compile megatron's fused linear sets attributes on the weight in its backward, which dynamo cannot
trace, inside megatron's activation-offloading context, where dynamo cannot resume: most of each layer runs eagerly
(debug model on CPU: 0 -> 20 graph breaks), with apex's kernel as with these. The training feature warns of the
combination (primus/features/training.py).
"""
from __future__ import annotations

import logging
import types

import torch

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.registry import Conditions, Workaround, pin

log = logging.getLogger("primus.megatron")

_STATE = {"cuda": None}  # None: not checked yet; True: the in-place out_dtype GEMM; False: the unfused sum


def _cuda_fused_ok(device) -> bool:
    """torch.addmm with out_dtype=float32 into its own fp32 input, on bf16 operands: present and right here."""
    if _STATE["cuda"] is None:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(64, 48, generator=g).to(device, torch.bfloat16)
        dy = torch.randn(64, 32, generator=g).to(device, torch.bfloat16)
        acc = torch.randn(32, 48, generator=g).to(device)
        want = acc + dy.float().t() @ x.float()
        try:
            torch.addmm(acc, dy.t(), x, out_dtype=torch.float32, out=acc)
            _STATE["cuda"] = bool(torch.allclose(acc, want, rtol=1e-4, atol=1e-4))
        except (RuntimeError, TypeError) as e:
            log.warning("gradient_accumulation_fusion: torch.addmm(out_dtype=float32) not usable here (%s); the "
                        "weight gradients are summed unfused", str(e).splitlines()[0][:200])
            _STATE["cuda"] = False
        if _STATE["cuda"]:
            log.info("gradient_accumulation_fusion: weight gradients accumulate into main_grad in the GEMM "
                     "(torch.addmm, out_dtype=float32)")
    return _STATE["cuda"]


def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (N, K) += grad_output (M, N)^T @ total_input (M, K), accumulated in fp32 (apex's contract)."""
    if main_grad.is_cuda:
        if _cuda_fused_ok(main_grad.device):
            torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32, out=main_grad)
        else:
            main_grad.add_(grad_output.t() @ total_input)
        return
    main_grad.addmm_(grad_output.t().float(), total_input.float())


def wgrad_gemm_accum_fp16(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """The same into a bf16 / fp16 main_grad (accumulate_allreduce_grads_in_fp32 off)."""
    main_grad.addmm_(grad_output.t().to(main_grad.dtype), total_input.to(main_grad.dtype))


KERNELS = types.SimpleNamespace(__name__="primus.backends.megatron.patches.grad_accum_fusion",
                                wgrad_gemm_accum_fp32=wgrad_gemm_accum_fp32,
                                wgrad_gemm_accum_fp16=wgrad_gemm_accum_fp16)


def _wanted(c: Conditions) -> bool:
    tc = c.args.get("transformer_config") or {}
    return bool(tc.get("gradient_accumulation_fusion")) and c.args.get("layer_spec") == "local"


def _install(_c: Conditions) -> None:
    from megatron.core.tensor_parallel import layers

    if getattr(layers, "_grad_accum_fusion_available", False) and \
            getattr(layers, "fused_weight_gradient_mlp_cuda", None) is not KERNELS:
        return  # apex is installed: megatron uses its kernel
    layers._grad_accum_fusion_available = True
    layers.fused_weight_gradient_mlp_cuda = KERNELS


WORKAROUNDS = (
    Workaround(
        "megatron.local.grad_accum_fusion",
        "megatron.core.tensor_parallel.layers: fused_weight_gradient_mlp_cuda, _grad_accum_fusion_available",
        "the local spec's gradient_accumulation_fusion needs apex's CUDA extension, which is not installed; "
        "megatron refuses the setting when it builds a linear",
        (pin("megatron-core", PINNED_MCORE),), "training.gradient_accumulation_fusion=true on the local spec",
        _wanted, _install, every_run=True, on_mismatch="skip",
        mismatch_note="it supplies the two functions megatron-core 0.16.1 calls, whose contract another version "
                      "may have changed; without it megatron refuses gradient_accumulation_fusion there"),
)
