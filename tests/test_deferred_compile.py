"""Deferred torch.compile (primus/patches/deferred_compile.py): the import-time decorations of megatron-core and
TorchTitan are built at first call."""
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from primus.patches import deferred_compile as dc


@pytest.fixture
def compiles(monkeypatch):
    """The real torch.compile as deferred() sees it, recording each call (the function, the arguments)."""
    seen = []

    def record(model, **kwargs):
        seen.append((model, kwargs))
        return lambda *a, **k: ("compiled", model(*a, **k))

    monkeypatch.setattr(dc, "_REAL_COMPILE", [record])
    return seen


def test_deferred_compiles_once_at_the_first_call_with_the_same_arguments(compiles):
    def helper(x, y=1):
        return x + y

    d = dc.deferred(helper, dynamic=False, mode="max-autotune")
    assert compiles == [] and d.__name__ == "helper" and d.primus_deferred_compile == []
    assert d(1, y=2) == ("compiled", 3) and d(2) == ("compiled", 3)
    assert compiles == [(helper, {"dynamic": False, "mode": "max-autotune"})]  # built once
    as_decorator = dc.deferred(mode="reduce-overhead")(helper)  # @torch.compile(mode=...) form
    assert as_decorator(5) == ("compiled", 6) and compiles[-1] == (helper, {"mode": "reduce-overhead"})
    module = torch.nn.Linear(2, 2)
    dc.deferred(module)  # a module goes to torch.compile at once
    assert compiles[-1] == (module, {})


def test_deferred_helper_inside_a_compiled_region_is_traced_without_a_graph_break(compiles, monkeypatch):
    """training.compile traces megatron's layers: a deferred helper there is the plain function, inlined into the
    outer graph (fullgraph=True fails on any break), and builds no compile of its own."""
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "disable", False)
    helper = dc.deferred(lambda x: torch.nn.functional.silu(x) * 2)
    outer = torch.compile(lambda x: helper(x) + 1, backend="eager", fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(outer(x), torch.nn.functional.silu(x) * 2 + 1)
    assert compiles == []
    torch._dynamo.reset()


@pytest.mark.e2e
def test_first_megatron_import_defers_its_compiles_and_restores_torch_compile():
    script = """
import sys, torch
real = torch.compile
from primus.backends.megatron.patches.deferred_compile import import_megatron_core
from primus.patches.deferred_compile import deferred
assert import_megatron_core() is True and import_megatron_core() is False
from megatron.core import jit
from megatron.core.fusions import fused_bias_swiglu
assert torch.compile is real and jit.jit_fuser is deferred
assert fused_bias_swiglu.swiglu.primus_deferred_compile == []
assert "torch._inductor.compile_fx" not in sys.modules
# megatron's `import wandb` got a stand-in (wandb's code has not run: no wandb.sdk), which works when used
from primus.patches.deferred_compile import _OnFirstUse
from megatron.core import timers
assert type(timers.wandb) is _OnFirstUse and sys.modules["wandb"] is timers.wandb and "wandb.sdk" not in sys.modules
import wandb
assert wandb.__version__ and "wandb.sdk" in sys.modules and callable(wandb.init) and callable(timers.wandb.init)
import wandb.sdk
assert type(sys.modules["wandb"]) is not _OnFirstUse  # the real module from its first use on
print("ok")
"""
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr[-3000:]


@pytest.mark.e2e
def test_torchtitan_patches_import_the_trainer_with_its_compiles_deferred():
    script = """
import sys, torch
real = torch.compile
from primus.backends.torchtitan import patches
from primus.patches.deferred_compile import deferred
applied = patches.apply("cpu")
assert applied["torchtitan.import.deferred_attention_compile"] is True and "torchtitan.train" in sys.modules
from torchtitan.models import attention
assert torch.compile is real and attention._compiled_create_block_mask.primus_deferred_compile == []
assert attention.FlexAttentionWrapper._compiled_flex_attn.__wrapped__ is attention.flex_attention
assert "torch._inductor.compile_fx" not in sys.modules
# Hugging Face datasets: not imported by the trainer's import; text_datasets' names import it at their first use
assert applied["torchtitan.import.deferred_hf_datasets"] is True and "datasets" not in sys.modules
from torchtitan.hf_datasets import text_datasets as td
assert not isinstance([], td.Dataset) and "datasets" in sys.modules
import datasets
ds = td.split_dataset_by_node(datasets.Dataset.from_dict({"text": ["a", "b"]}), 0, 2)
assert isinstance(ds, td.Dataset) and len(ds) == 1 and td.load_dataset.__name__ == "load_dataset"
print("ok")
"""
    p = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr[-3000:]
