"""Fixes for megatron-core 0.16.1 defects hit without Transformer Engine, on every device (GPU included).

- `transformer/moe/moe_utils.py` imports `te_general_gemm` only inside its `try: import transformer_engine`
  block, yet `RouterGatingLinearFunction` tests `te_general_gemm is not None` unconditionally: without TE every
  MoE router forward raises NameError. Defining the name as None selects megatron's own torch matmul path.
"""
from __future__ import annotations


def apply() -> None:
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
