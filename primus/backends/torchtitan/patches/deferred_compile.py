"""Workaround: importing TorchTitan's trainer pays for torch.compile's compiler stack and compiles nothing.

Upstream behaviour (torchtitan 0.2.2, torch 2.11 / 2.13): torchtitan/models/attention.py applies torch.compile when
it loads (VarlenAttentionWrapper._compiled_varlen_attn, FlexAttentionWrapper._compiled_flex_attn,
_compiled_create_block_mask), and `torchtitan.train` imports it. Each torch.compile() call imports torch._dynamo
and torch._inductor to read their configuration: about 1 s of CPU in every TorchTitan process, while a model with
SDPA attention never calls them.

Applied first by `apply()` (before any other workaround imports TorchTitan): torchtitan.train is imported with
torch.compile deferred to each entry point's first call (primus/patches/deferred_compile.py says how, and why it
runs the same code). Applied on another version too (with the registry's warning): it changes when an entry point
is compiled, never what runs.
"""
from __future__ import annotations

from primus.backends.torchtitan import PINNED_VERSION
from primus.patches.deferred_compile import import_deferring_compile
from primus.patches.registry import TORCH, Workaround, pin

DEFERRED_COMPILE = Workaround(
    "torchtitan.import.deferred_attention_compile",
    "torchtitan.models.attention (torch.compile applied to the varlen / flex attention entry points at import)",
    "each torch.compile() call imports torch._dynamo and torch._inductor to read their configuration: about 1 s "
    "of CPU in every TorchTitan process, for entry points an SDPA model never calls",
    (pin("torchtitan", PINNED_VERSION), pin("torch", *TORCH)), "torchtitan.train is not imported yet",
    lambda _c: True, lambda _c: import_deferring_compile("torchtitan.train"))

WORKAROUNDS = (DEFERRED_COMPILE,)
