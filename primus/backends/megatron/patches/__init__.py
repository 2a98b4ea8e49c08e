"""Every megatron-core workaround of this backend, registered as data and applied by one `apply()`.

Each entry (a `primus.patches.registry.Workaround`) names the upstream behaviour it works around, the
megatron-core version it was written against (0.16.1) and when it applies; `apply()` checks the installed version
and says so in the log when it differs (see the registry for what is applied anyway and what is skipped).

  cpu.py           CPU only: megatron-core's CUDA assumptions redirected (device='cuda', torch.cuda calls, CUDA RNG
                   states, type-string checks, split sizes, tied-embedding copy, jit helpers)
  no_te.py         without Transformer Engine: MoE router's te_general_gemm name, MLA's HAVE_TE
  optimizer.py     without TE / apex: torch foreach kernels for the optimizer's per-tensor fallbacks
  grouped_gemm.py  local-spec GroupedMLP without the grouped_gemm package: a torch grouped GEMM
  grad_accum_fusion.py  local-spec gradient_accumulation_fusion without apex: the weight gradient accumulated
                   into main_grad by a torch GEMM
  torch_compile.py training.compile: the TP-group lookup's per-call warning that breaks compiled graphs
  deferred_compile.py  `import megatron.core`: its torch.compile decorations import the compiler stack (seconds);
                   applied by `deferred_compile.import_megatron_core()`, from the trainer, before megatron loads

Not here, because they are features (primus' own kernels or behaviour put into megatron on a user's request, not
fixes of upstream defects): turbo.py (turbo.* module and entry-point swaps), fusions.py (Triton RoPE / SwiGLU
through megatron's fusion entry points), fp8.py and tuned_gemm.py (linears' GEMMs), perf.py (compiled layers and
loss, fused AdamW), recompute_ids.py (recompute by layer ids), checkpoint.py (non-finite guard).
"""
from __future__ import annotations

from typing import Any, Dict

from primus.patches.registry import Conditions, apply_all

from . import cpu, deferred_compile, grad_accum_fusion, grouped_gemm, no_te, optimizer, torch_compile

# applied in this order: the CPU redirections after the TE-less fixes and before what the compile step re-enables.
# The deferred compile is applied before megatron is imported (the trainer's first step); listed here with the
# others, it finds megatron imported and does nothing.
WORKAROUNDS = (deferred_compile.DEFERRED_COMPILE,) + no_te.WORKAROUNDS + optimizer.WORKAROUNDS + cpu.WORKAROUNDS \
    + torch_compile.WORKAROUNDS + grouped_gemm.WORKAROUNDS + grad_accum_fusion.WORKAROUNDS


def apply(device: str, args: Dict[str, Any]) -> Dict[str, Any]:
    """Apply the workarounds that hold for this run (`device`: "cpu" | "cuda"; `args`: args.build_args' dict), once
    per trainer, after megatron's modules are imported and before the model is built. Returns {name: result}."""
    import torch

    return apply_all(WORKAROUNDS, Conditions(device=device, rocm=torch.version.hip is not None, args=args))


def refresh() -> int:
    """The CPU redirections reach megatron modules imported since `apply()` (lazy imports while building, the
    checkpointing modules); returns how many were rebound. Nothing to do off CPU."""
    return cpu.refresh()
