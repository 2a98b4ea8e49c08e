"""torch's multi-tensor (foreach) kernels for megatron-core's optimizer when neither Transformer Engine nor apex is
installed.

Upstream behaviour worked around (megatron-core 0.16.1, `megatron/core/utils.py`): without TE / apex,
`optimizer/optimizer.py` and `optimizer/clip_grads.py` bind `local_multi_tensor_l2_norm` and
`local_multi_tensor_scale`, Python loops over the parameters:
- the gradient-norm one computes one norm per tensor and builds `torch.tensor(list_of_cuda_scalars)` from them:
  one device-to-host copy and one device sync per parameter (98 per step on Llama-3.2-1B), so the host stops
  queueing kernels while the GPU drains;
- the scale one runs `dst.copy_(src * scale)`: a temporary plus a second pass per tensor, used for gradient
  clipping (scale = clip coefficient, src is dst) and for copying the fp32 main params into the bf16 model params
  after every step (scale = 1.0).
Profiled on the H200 (2026-11-29, megatron bf16, 515 ms step): ~10 ms of kernels (norm, mul, device copies, bf16
copies: 400 launches) plus the syncs. The replacements compute the same values with `torch._foreach_*` (a few
multi-tensor kernels, no host sync); `install()` swaps them in only where megatron bound its local fallbacks.
That guard makes it safe on another megatron-core version too: it applies there (with the registry's warning) and
replaces nothing unless it finds megatron's own fallback functions bound.
"""
from __future__ import annotations

from typing import List

import torch

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.registry import Conditions, Workaround, pin


def l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """amp_C.multi_tensor_l2norm's contract as megatron calls it: (norm of all tensors as a [1] fp32 tensor, None)."""
    tensors: List[torch.Tensor] = [t for lst in tensor_lists for t in lst]
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    total = torch.linalg.vector_norm(torch.stack(norms))
    return total.reshape(1), None


def scale(chunk_size, noop_flag, tensor_lists, factor):
    """amp_C.multi_tensor_scale's contract: tensor_lists = [src, dst]; dst = src * factor (dst may be src)."""
    src, dst = tensor_lists
    if not src:
        return
    if all(s is d for s, d in zip(src, dst)):
        torch._foreach_mul_(dst, factor)
    elif factor == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, factor))


def install(_cond: Conditions = None) -> List[str]:
    """Swap in the foreach versions where megatron uses its local fallbacks; returns the module.names replaced."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    swaps = {(clip_grads, "l2_norm_impl"): (utils.local_multi_tensor_l2_norm, l2_norm),
             (clip_grads, "multi_tensor_scale_impl"): (utils.local_multi_tensor_scale, scale),
             (optimizer, "multi_tensor_scale_impl"): (utils.local_multi_tensor_scale, scale)}
    done = []
    for (mod, name), (local, ours) in swaps.items():
        if getattr(mod, name, None) is local:
            setattr(mod, name, ours)
            done.append(f"{mod.__name__.rsplit('.', 1)[-1]}.{name}")
        elif getattr(mod, name, None) is ours:
            done.append(f"{mod.__name__.rsplit('.', 1)[-1]}.{name}")
    return done


WORKAROUNDS = (
    Workaround(
        "megatron.optimizer.foreach_multi_tensor",
        "megatron.core.utils.local_multi_tensor_l2_norm / local_multi_tensor_scale as bound by optimizer.clip_grads "
        "and optimizer.optimizer",
        "without TE / apex, per-parameter Python loops: one device-to-host sync per parameter for the grad norm, a "
        "temporary and a second pass per tensor for scaling",
        (pin("megatron-core", PINNED_MCORE),), "megatron bound its local fallbacks (no TE / apex)", lambda _c: True,
        install, every_run=True),
)
