"""Fixes for megatron-core 0.16.1 defects hit without Transformer Engine, on every device (GPU included).

- `transformer/moe/moe_utils.py` imports `te_general_gemm` only inside its `try: import transformer_engine`
  block, yet `RouterGatingLinearFunction` tests `te_general_gemm is not None` unconditionally: without TE every
  MoE router forward raises NameError. Defining the name as None selects megatron's own torch matmul path.
- `transformer/multi_latent_attention.py` sets HAVE_TE from an import that succeeds without TE (the extension
  module stands mock objects in for its TE classes), then calls `isinstance(..., TELinear)` with that mock:
  every MLA layer fails to build. HAVE_TE is set to what it means (Transformer Engine importable).

Both apply on a version mismatch: each only sets a name to what megatron's own code means by it.
"""
from __future__ import annotations

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.registry import Conditions, Workaround, pin


def _te_general_gemm_name(_cond: Conditions) -> bool:
    from megatron.core.transformer.moe import moe_utils

    if hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    return True


def _mla_have_te(_cond: Conditions) -> None:
    from megatron.core.transformer import multi_latent_attention as mla

    mla.HAVE_TE = False


def _te_missing(_cond: Conditions) -> bool:
    from primus.features.precision import te_available

    return not te_available()


_MCORE = (pin("megatron-core", PINNED_MCORE),)

WORKAROUNDS = (
    Workaround(
        "megatron.no_te.te_general_gemm_name",
        "megatron.core.transformer.moe.moe_utils.te_general_gemm (RouterGatingLinearFunction)",
        "the name is defined only when Transformer Engine imports, yet tested unconditionally: without TE every MoE "
        "router forward raises NameError",
        _MCORE, "every run (the name is only defined where missing)", lambda _c: True, _te_general_gemm_name,
        every_run=True),
    Workaround(
        "megatron.no_te.mla_have_te",
        "megatron.core.transformer.multi_latent_attention.HAVE_TE",
        "set True by an import that succeeds without TE (mock classes), then isinstance(..., TELinear) on the mock: "
        "every MLA layer fails to build",
        _MCORE, "Transformer Engine not importable", _te_missing, _mla_have_te, every_run=True),
)
