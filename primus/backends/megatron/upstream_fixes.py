"""Fixes for megatron-core 0.16.1 defects hit without Transformer Engine, on every device (GPU included).

- `transformer/moe/moe_utils.py` imports `te_general_gemm` only inside its `try: import transformer_engine`
  block, yet `RouterGatingLinearFunction` tests `te_general_gemm is not None` unconditionally: without TE every
  MoE router forward raises NameError. Defining the name as None selects megatron's own torch matmul path.
- `transformer/multi_latent_attention.py` sets HAVE_TE from an import that succeeds without TE (the extension
  module stands mock objects in for its TE classes), then calls `isinstance(..., TELinear)` with that mock:
  every MLA layer fails to build. HAVE_TE is set to what it means (Transformer Engine importable).
"""
from __future__ import annotations


def apply() -> None:
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    from megatron.core.transformer import multi_latent_attention as mla

    from primus.features.precision import te_available

    if not te_available():
        mla.HAVE_TE = False
