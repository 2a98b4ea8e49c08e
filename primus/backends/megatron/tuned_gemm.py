"""GEMM tuning stage 3 on CUDA for the megatron backend.

`tuning.apply.install_tuned_linear` (train_loop.py, before the trainer is built) routes `torch.nn.functional.linear`;
megatron-core's linears never call it: their own autograd Function multiplies with `torch.matmul`. So each
Column/RowParallelLinear of a built chunk (decoder, output layer, MTP) whose GEMM is still megatron's gets the same
replacement point the portable fp8 path uses (fp8.py): megatron's input communication, then
`tuning.apply.tuned_linear` (tuned shapes through cuBLASLt, the rest torch's own linear). Weight gradients land in
`weight.grad` as on megatron's non-fused path, so DDP's main_grad hooks are unchanged; linears already taken by the
portable fp8 path or the turbo parallel linear keep theirs.
"""
from __future__ import annotations


def apply(model) -> int:
    """Route one GPTModel chunk's remaining megatron linears through the tuned path; returns how many."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from primus.backends.megatron.fp8 import column_impl, row_impl
    from tuning.apply import tuned_linear

    column, row = column_impl(tuned_linear, eager=False), row_impl(tuned_linear, eager=False)
    n = 0
    for mod in model.modules():
        if not isinstance(mod, (ColumnParallelLinear, RowParallelLinear)):
            continue
        if getattr(mod, "primus_gemm", None) or getattr(mod, "primus_turbo_linear", None):
            continue
        mod._forward_impl = column if isinstance(mod, ColumnParallelLinear) else row
        mod.primus_gemm = "tuned"
        n += 1
    return n
