"""Run megatron-core 0.16.1's real training code on CPU (gloo), for CI machines without a GPU.

megatron-core has no CPU mode. Its modules, optimizer, DDP wrapper and pipeline schedules are device-agnostic
except for a handful of CUDA-only spots; this module redirects exactly those, and is used only when the run's
device is the CPU (a GPU machine refuses it). Each item is registered as one or more workarounds (`WORKAROUNDS`,
applied by `primus.backends.megatron.patches.apply`). Upstream behaviours worked around:

1. `torch.cuda.current_device()` passed as `device=` (global memory buffer, DDP grad/param buffers, tensor-parallel
   mappings and layers, pipeline p2p buffers) and hard-coded `device="cuda"` / `'cuda'` in the FP32/mixed-precision
   optimizers' scale tensors, grad clipping, the local multi-tensor l2-norm, count-zeros and pipeline schedules.
   -> inside megatron.core modules only, the name `torch` is rebound to a thin proxy whose tensor factories map a
   CUDA device to CPU and whose `torch.cuda` answers current_device/synchronize/empty_cache/RNG calls for the CPU.
   The real `torch` module is untouched for everyone else.
2. The model-parallel RNG tracker (`tensor_parallel.random`) saves and restores CUDA generator states.
   -> its two state helpers are replaced by CPU-generator equivalents, so forked RNG regions keep their meaning.
3. Type-string assertions: the mixed-precision and distributed optimizers accept only
   'torch.cuda.{Half,BFloat16,Float}Tensor' params, and grad clipping asserts 'torch.cuda.FloatTensor' grads.
   -> grad clipping and megatron's optimizer factory (`get_megatron_optimizer`, which builds the mixed-precision
   and the distributed optimizer) run with `Tensor.type()` answering the CUDA name for CPU tensors (scoped to the call).
4. dist_checkpointing / parallel_state call `torch.cuda.synchronize()`; MoE shared experts and the alltoall token
   dispatcher create side CUDA streams and events. -> through (1): synchronize is a no-op, streams and events are
   stand-ins whose waits and records do nothing (CPU ops already run in program order).

5. The MoE alltoall dispatcher turns its split sizes into numpy only when they sit on the GPU
   (`moe_utils.maybe_move_tensor_to_cpu`); CPU tensors reach `all_to_all_single`, which rejects tensors as split
   sizes. -> that helper also converts CPU tensors when numpy is asked for.

6. With tied embeddings and pp > 1, `LanguageModule.setup_embeddings_and_output_layer` moves the last stage's
   copy with `weight.data.cuda()` before syncing it. -> that method runs with `Tensor.cuda` returning the tensor
   itself (scoped to the call).
7. megatron's jit-fused helpers (`jit_fuser` = torch.compile: SwiGLU with router probs, fused cross entropy) would
   compile per shape on CPU, costing seconds for nothing. -> torch.compile is switched off for this process
   (`torch._dynamo.config.disable`): they run eagerly, same math.

Not worked around (capability_issues reports them before launch): optimizer CPU offload, Transformer Engine specs,
fp8/fp4. Sequence parallel does run: the stock torch norm asserts
it off, but spec.py's RMSNorm (used on every device without TE) supports it.

Every item is pinned to megatron-core 0.16.1 and applied on a version mismatch too (with the registry's warning):
without them megatron-core cannot train on CPU at all, and each one replaces a CUDA call by its CPU meaning.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import sys
import types
from typing import Any

import torch

from primus.backends.megatron.args import PINNED_MCORE
from primus.patches.registry import Conditions, Workaround, pin

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "as_tensor",
              "zeros_like", "ones_like", "empty_like", "full_like")


def _cpu_device(dev: Any) -> Any:
    if dev is None:
        return None
    if isinstance(dev, int):
        return torch.device("cpu")
    if isinstance(dev, str) and dev.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cpu")
    return dev


def _on_cpu(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


class _Event:
    """A CUDA event on CPU: work is already done when it is recorded."""

    def record(self, *_a, **_k):
        return None

    def wait(self, *_a, **_k):
        return None

    def synchronize(self):
        return None

    def query(self):
        return True


class _Stream(_Event):
    """A CUDA stream on CPU: every op runs in program order, so waits and records are no-ops."""

    def __init__(self, *_a, **_k):
        pass

    def wait_stream(self, *_a, **_k):
        return None

    def wait_event(self, *_a, **_k):
        return None

    def record_event(self, event=None):
        return event or _Event()


_STREAM = _Stream()


class _CudaOnCpu(types.ModuleType):
    """`torch.cuda` as megatron sees it on a CPU-only machine."""

    def __init__(self):
        super().__init__("torch.cuda")

    @staticmethod
    def current_device():
        return torch.device("cpu")

    @staticmethod
    def synchronize(*_a, **_k):
        return None

    @staticmethod
    def empty_cache():
        return None

    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0

    @staticmethod
    def get_rng_state(*_a, **_k):
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state, *_a, **_k):
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed):
        torch.manual_seed(seed)

    @staticmethod
    def memory_allocated(*_a, **_k):
        return 0

    max_memory_allocated = memory_allocated
    memory_reserved = memory_allocated
    max_memory_reserved = memory_allocated

    Stream = _Stream
    Event = _Event

    @staticmethod
    def current_stream(*_a, **_k):
        return _STREAM

    default_stream = current_stream

    @staticmethod
    def stream(_s):
        return contextlib.nullcontext()

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _TorchOnCpu(types.ModuleType):
    """The `torch` name inside megatron.core modules: real torch, except CUDA device requests become CPU."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = _CudaOnCpu()
        for name in _FACTORIES:
            setattr(self, name, _on_cpu(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


_PROXY: Any = None


def _cpu_rng_get(*_a, **_k):
    return torch.get_rng_state()


def _cpu_rng_set(state, *_a, **_k):
    torch.set_rng_state(state)


@contextlib.contextmanager
def cuda_type_names():
    """Within the block, `t.type()` of a CPU tensor reads 'torch.cuda.X' (megatron's dtype checks compare
    these strings); every other use of `Tensor.type` is unchanged."""
    orig = torch.Tensor.type

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs and self.device.type == "cpu":
            return orig(self).replace("torch.", "torch.cuda.", 1)
        return orig(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_
    try:
        yield
    finally:
        torch.Tensor.type = orig


@contextlib.contextmanager
def tensors_stay_on_cpu():
    """Within the block, `t.cuda()` returns `t` (megatron moves freshly built CPU tensors to the GPU)."""
    orig = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *_a, **_k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = orig


def _in_cpu_scope(fn, scope):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with scope():
            return fn(*args, **kwargs)

    wrapper.__primus_cpu_compat__ = True
    return wrapper


def _patch_loaded_modules() -> int:
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("megatron.core"):
            continue
        if getattr(mod, "torch", None) is torch:
            mod.torch = _PROXY
            n += 1
    return n


def _torch_proxy(_cond: Conditions) -> int:
    """(1), (4): rebind `torch` in the megatron.core modules loaded now; `refresh()` covers later imports."""
    global _PROXY
    if torch.cuda.is_available():
        raise RuntimeError("megatron's CPU redirections are for machines without a GPU; a GPU is present")
    if _PROXY is None:
        _PROXY = _TorchOnCpu()
    from megatron.core.optimizer import clip_grads, optimizer  # noqa: F401 - loaded, so rebound here
    from megatron.core.tensor_parallel import random  # noqa: F401

    return _patch_loaded_modules()


def _jit_helpers_eager(_cond: Conditions) -> None:
    """(7); with training.compile the compile workarounds (compile.py) turn dynamo back on."""
    torch._dynamo.config.disable = True


def _rng_tracker(_cond: Conditions) -> None:
    from megatron.core.tensor_parallel import random as mp_random

    # A forked region swaps the CPU generator here, which megatron then reports as "CPU RNG state changed
    # within GPU RNG context" on every fork: expected on CPU, so that logger is quietened.
    logging.getLogger(mp_random.__name__).setLevel(logging.ERROR)
    mp_random._get_cuda_rng_state = _cpu_rng_get
    mp_random._set_cuda_rng_state = _cpu_rng_set


def _moe_split_sizes(_cond: Conditions) -> None:
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    to_cpu = moe_utils.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return to_cpu(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def _tied_embedding_copy(_cond: Conditions) -> None:
    from megatron.core.models.common.language_module.language_module import LanguageModule

    LanguageModule.setup_embeddings_and_output_layer = _in_cpu_scope(
        LanguageModule.setup_embeddings_and_output_layer, tensors_stay_on_cpu)


def _clip_grad_type_check(_cond: Conditions) -> None:
    from megatron.core.optimizer import clip_grads, optimizer

    clip = _in_cpu_scope(clip_grads.clip_grad_by_total_norm_fp32, cuda_type_names)
    clip_grads.clip_grad_by_total_norm_fp32 = clip
    optimizer.clip_grad_by_total_norm_fp32 = clip


def _optimizer_type_check(_cond: Conditions) -> None:
    import megatron.core.optimizer as mopt

    mopt.get_megatron_optimizer = _in_cpu_scope(mopt.get_megatron_optimizer, cuda_type_names)


def refresh() -> int:
    """Rebind `torch` in megatron modules imported since the redirections were applied; returns how many."""
    return _patch_loaded_modules() if _PROXY is not None else 0


def _cpu_run(cond: Conditions) -> bool:
    return cond.device == "cpu"


_MCORE = (pin("megatron-core", PINNED_MCORE),)

WORKAROUNDS = (
    Workaround(
        "megatron.cpu.torch_proxy",
        "torch.cuda.current_device() / device='cuda' / torch.cuda.synchronize / CUDA streams and events inside "
        "megatron.core modules (global memory buffer, DDP buffers, TP layers, p2p, optimizers, dist_checkpointing, "
        "MoE dispatcher)",
        "CUDA-only calls and hard-coded 'cuda' devices fail on a machine without a GPU (items 1 and 4)",
        _MCORE, "device is CPU", _cpu_run, _torch_proxy, every_run=True),
    Workaround(
        "megatron.cpu.jit_helpers_eager",
        "megatron.core.jit.jit_fuser (torch.compile on SwiGLU with probs, fused cross entropy)",
        "each helper compiles per shape on CPU: seconds of compile for no gain (item 7)",
        _MCORE, "device is CPU", _cpu_run, _jit_helpers_eager, every_run=True),
    Workaround(
        "megatron.cpu.rng_tracker",
        "megatron.core.tensor_parallel.random._get_cuda_rng_state / _set_cuda_rng_state",
        "the model-parallel RNG tracker saves and restores CUDA generator states (item 2)",
        _MCORE, "device is CPU", _cpu_run, _rng_tracker),
    Workaround(
        "megatron.cpu.moe_split_sizes",
        "megatron.core.transformer.moe.moe_utils.maybe_move_tensor_to_cpu (and token_dispatcher's binding)",
        "CPU split sizes are not turned into numpy, and all_to_all_single rejects tensors as split sizes (item 5)",
        _MCORE, "device is CPU", _cpu_run, _moe_split_sizes),
    Workaround(
        "megatron.cpu.tied_embedding_copy",
        "megatron.core.models.common.language_module.LanguageModule.setup_embeddings_and_output_layer",
        "with tied embeddings and pp > 1 the last stage's copy is moved with weight.data.cuda() (item 6)",
        _MCORE, "device is CPU", _cpu_run, _tied_embedding_copy),
    Workaround(
        "megatron.cpu.clip_grad_type_check",
        "megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32 (and optimizer's binding)",
        "asserts grads are 'torch.cuda.FloatTensor' (item 3)",
        _MCORE, "device is CPU", _cpu_run, _clip_grad_type_check),
    Workaround(
        "megatron.cpu.optimizer_type_check",
        "megatron.core.optimizer.get_megatron_optimizer (the mixed-precision optimizer it builds)",
        "accepts only 'torch.cuda.{Half,BFloat16,Float}Tensor' params (item 3)",
        _MCORE, "device is CPU", _cpu_run, _optimizer_type_check),
)
