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

Without overlap_grad_reduce (one GPU, or data parallel reducing after the backward), and at tensor-parallel size 1
without sequence parallel, the local linears go further through `_FusedLinear` (megatron's
`linear_with_grad_accumulation_and_async_allreduce` answers for them): the same GEMMs, the accumulation as the
custom op `primus::wgrad_accumulate` (it declares `main_grad` mutated), and no weight gradient returned, so that
DDP's hook, which would only skip it, does not run. Nothing in that backward touches Python state, so under
training.compile the linear stays inside the layer's graph. megatron's own fused linear, which the other cases keep,
sets attributes on the weight in its backward inside megatron's activation-offloading context, where dynamo can
neither trace nor resume: most of each layer then runs eagerly (debug model on CPU: 0 -> 20 graph breaks), with
apex's kernel as with these; the training feature warns of that combination (primus/features/training.py).

The word embedding keeps megatron's path (F.embedding, whose backward writes a dense vocab x hidden bf16 gradient that
DDP's hook then adds). Adding only the touched rows into main_grad instead (`index_put_` with accumulate, megatron's
deterministic form of that backward) was measured slower: 0.977x in a compiled DeepSeek-V2-Lite step on an H100
(5 layers, 2 runs each, interleaved; docs/benchmarks.md), where the dense add it removes is under 3% of the step.
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
            err = (acc - want).abs().max().item()
            why = None if err <= 1e-3 else f"it differs from the fp32 sum by {err:.3g}"
        except (RuntimeError, TypeError) as e:
            why = str(e).splitlines()[0][:200]
        _STATE["cuda"] = why is None
        if why:
            log.warning("gradient_accumulation_fusion: torch.addmm(out_dtype=float32) into main_grad is not usable "
                        "here (%s): the weight gradients are computed, then added, unfused", why)
        else:
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


@torch.library.custom_op("primus::wgrad_accumulate", mutates_args=("main_grad",))
def wgrad_accumulate(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad += grad_output^T @ total_input (2-D operands), in main_grad's dtype's accumulation."""
    if main_grad.dtype == torch.float32:
        wgrad_gemm_accum_fp32(total_input, grad_output, main_grad)
    else:
        wgrad_gemm_accum_fp16(total_input, grad_output, main_grad)


@wgrad_accumulate.register_fake
def _(total_input, grad_output, main_grad) -> None:
    return None


class _FusedLinear(torch.autograd.Function):
    """y = x W^T (+ b) at tp = 1; backward: dx = dy W, the weight gradient accumulated into `main_grad`, none
    returned for the weight (see the module doc)."""

    @staticmethod
    def forward(ctx, x, weight, bias, main_grad):
        ctx.save_for_backward(x, weight)
        ctx.main_grad = main_grad  # not saved_tensors: it changes in place between micro batches, by design
        ctx.has_bias = bias is not None
        y = torch.matmul(x, weight.t())
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx = dy.matmul(weight)
        dy2 = dy.reshape(-1, dy.shape[-1])
        torch.ops.primus.wgrad_accumulate(x.reshape(-1, x.shape[-1]), dy2, ctx.main_grad)
        return dx, None, (dy2.sum(0) if ctx.has_bias else None), None


def _fused_linear(orig):
    """megatron's linear_with_grad_accumulation_and_async_allreduce, with the cases `_FusedLinear` serves."""
    def linear_with_grad_accumulation_and_async_allreduce(input, weight, bias, gradient_accumulation_fusion,
                                                          allreduce_dgrad, sequence_parallel, grad_output_buffer=None,
                                                          wgrad_deferral_limit=0, async_grad_allreduce=None,
                                                          tp_group=None):
        main_grad = getattr(weight, "main_grad", None)
        if gradient_accumulation_fusion and main_grad is not None and not (allreduce_dgrad or sequence_parallel) \
                and grad_output_buffer is None:
            return _FusedLinear.apply(input, weight, bias, main_grad)
        return orig(input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad, sequence_parallel,
                    grad_output_buffer, wgrad_deferral_limit, async_grad_allreduce, tp_group)

    linear_with_grad_accumulation_and_async_allreduce.warned = False  # megatron's own flag, read from this name
    linear_with_grad_accumulation_and_async_allreduce.__primus_orig__ = orig
    return linear_with_grad_accumulation_and_async_allreduce


KERNELS = types.SimpleNamespace(__name__="primus.backends.megatron.patches.grad_accum_fusion",
                                wgrad_gemm_accum_fp32=wgrad_gemm_accum_fp32,
                                wgrad_gemm_accum_fp16=wgrad_gemm_accum_fp16)


def _wanted(c: Conditions) -> bool:
    tc = c.args.get("transformer_config") or {}
    return bool(tc.get("gradient_accumulation_fusion")) and c.args.get("layer_spec") == "local"


def _install(c: Conditions) -> str:
    """Returns which path the run's linears take (logged with the applied workarounds)."""
    from megatron.core.tensor_parallel import layers

    linear = layers.linear_with_grad_accumulation_and_async_allreduce
    orig = getattr(linear, "__primus_orig__", linear)
    layers.linear_with_grad_accumulation_and_async_allreduce = orig  # this run decides afresh
    if getattr(layers, "_grad_accum_fusion_available", False) and \
            getattr(layers, "fused_weight_gradient_mlp_cuda", None) is not KERNELS:
        return "apex"  # installed: megatron uses its kernel
    layers._grad_accum_fusion_available = True
    layers.fused_weight_gradient_mlp_cuda = KERNELS
    if (c.args.get("ddp_config") or {}).get("overlap_grad_reduce"):
        return "megatron's linear, torch accumulation"  # DDP's hook must see every weight gradient
    layers.linear_with_grad_accumulation_and_async_allreduce = _fused_linear(orig)
    return "primus fused linear at tp = 1 (megatron's linear elsewhere), torch accumulation"


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
