"""Register our train specs and flavors in TorchTitan's registry, built on its own llama3 / qwen3 / deepseek_v3.

Each spec is TorchTitan's own (model, parallelize, pipelining, optimizer, LR, loss) with four swaps: our flavor
table, our offline data builders (data.py), a metrics processor that records the step's metrics instead of
printing them (the shared loop prints), and subclasses of two models: llama3 that can tie embeddings, qwen3 with
attention sinks (TorchTitan 0.2.2 has them in its gpt_oss model only).
"""
from __future__ import annotations

import dataclasses
import time
import typing
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.models.llama3 import Transformer, TransformerModelArgs
from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
from torchtitan.models.qwen3.model.model import Qwen3Model
from torchtitan.protocols import train_spec as ts

from primus.backends.torchtitan import data, patches
from primus.backends.torchtitan.flavors import DEEPSEEK_V3, LLAMA3, QWEN3


@dataclasses.dataclass
class PrimusLlamaArgs(TransformerModelArgs):
    tie_word_embeddings: bool = False

    def get_nparams_and_flops(self, model: torch.nn.Module, seq_len: int):
        nparams, flops = super().get_nparams_and_flops(model, seq_len)
        if self.tie_word_embeddings:
            # TorchTitan leaves the embedding table out of the FLOPs (a lookup); tied, it is also the output matmul
            flops += 6 * self.vocab_size * self.dim
        return nparams, flops


class PrimusLlama(Transformer):
    """TorchTitan's llama3 Transformer, optionally with the output projection tied to the input embedding.

    Tied, the table lives under `embedding` and `tok_embeddings` / `output` are None: TorchTitan's FSDP then
    leaves it (and the final norm) to the root FSDP unit, which holds it unsharded through the whole forward, so
    the lookup and the output matmul share one parameter and one gradient.
    """

    def __init__(self, model_args: PrimusLlamaArgs):
        super().__init__(model_args)
        self.tied = model_args.tie_word_embeddings
        if self.tied:
            self.embedding = self.tok_embeddings
            self.tok_embeddings = None
            self.output = None

    def init_weights(self, buffer_device: Optional[torch.device] = None):
        super().init_weights(buffer_device=buffer_device)
        if self.tied:
            # the output projection's scale (TorchTitan's output init); RMSNorm after the lookup absorbs it
            std = self.model_args.dim ** -0.5
            torch.nn.init.trunc_normal_(self.embedding.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens, attention_masks=None, positions=None):
        if not self.tied:
            return super().forward(tokens, attention_masks=attention_masks, positions=positions)
        h = self.embedding(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis, attention_masks=attention_masks, positions=positions)
        return F.linear(self.norm(h), self.embedding.weight)


@dataclasses.dataclass
class PrimusQwen3Args(Qwen3ModelArgs):
    use_sink_attention: bool = False  # model.use_sink_attention and its window (flavors.py)
    sink_sliding_window: int = 0
    sink_window_even_layers_only: bool = True


class SinkSDPA(torch.nn.Module):
    """An attention core with learned sinks (one logit per head; primus.backends.attention_sinks), in the place of
    TorchTitan's SDPA wrapper: the same call (q, k, v as [b, heads, s, d], scale, enable_gqa, is_causal)."""

    def __init__(self, n_heads: int, window: Optional[tuple]):
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.empty(n_heads))
        self.window = window

    def forward(self, q, k, v, *, scale=None, enable_gqa=False, is_causal=True):
        from primus.backends.attention_sinks import sink_attention

        return sink_attention(q, k, v, self.sinks, scale if scale is not None else q.shape[-1] ** -0.5, is_causal,
                              window=self.window)


class PrimusQwen3(Qwen3Model):
    """TorchTitan's qwen3, with attention sinks in every layer's attention core where the flavor asks for them:
    the window on layers 0, 2, ... (gpt-oss's alternation, megatron's window_attn_skip_freq=2) or on all."""

    def __init__(self, model_args: PrimusQwen3Args):
        super().__init__(model_args)
        if not model_args.use_sink_attention:
            return
        w = model_args.sink_sliding_window
        for layer_id, block in self.layers.items():
            windowed = w > 0 and (not model_args.sink_window_even_layers_only or int(layer_id) % 2 == 0)
            block.attention.inner_attention = SinkSDPA(model_args.n_heads, (w, 0) if windowed else None)

    def init_weights(self, buffer_device: Optional[torch.device] = None):
        super().init_weights(buffer_device=buffer_device)
        with torch.no_grad():  # as megatron-core's learnable softmax offset: normal(0, 0.02)
            for m in self.modules():
                if isinstance(m, SinkSDPA):
                    torch.nn.init.normal_(m.sinks, mean=0.0, std=0.02)


class RecordingMetricsProcessor(MetricsProcessor):
    """Keeps the metrics TorchTitan computes each step (global loss, grad norm, lr) for the shared loop, which
    does the printing, timing and result.json; TorchTitan's own console line is not printed."""

    last: Optional[Dict[str, Any]] = None

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        self.last = {"step": step, "loss": float(global_avg_loss), "max_loss": float(global_max_loss),
                     "grad_norm": float(grad_norm), **(extra_metrics or {})}
        self.logger.log({"loss_metrics/global_avg_loss": self.last["loss"], "grad_norm": self.last["grad_norm"]},
                        step)
        self.ntokens_since_last_log = 0
        self.data_loading_times.clear()
        self.time_last_log = time.perf_counter()

    last_validation: Optional[Dict[str, Any]] = None

    def log_validation(self, loss, step, extra_metrics=None):
        # the shared loop logs it (step log, TensorBoard, result.json)
        self.last_validation = {"step": step, "loss": float(loss)}


def _build_metrics(job_config, parallel_dims, model_args=None, tag=None):
    return RecordingMetricsProcessor(job_config, parallel_dims, tag)


def _post_parallelize(fn):
    def parallelize(model, parallel_dims, job_config):
        return patches.after_parallelize(fn(model, parallel_dims, job_config))

    return parallelize


def _family(spec_name: str):
    if spec_name == LLAMA3:
        from torchtitan.models import llama3 as fam

        return fam.get_train_spec(), PrimusLlamaArgs, PrimusLlama
    if spec_name == QWEN3:
        from torchtitan.models import qwen3 as fam

        return fam.get_train_spec(), PrimusQwen3Args, PrimusQwen3
    if spec_name == DEEPSEEK_V3:
        from torchtitan.models import deepseek_v3 as fam
    else:
        raise ValueError(f"unknown Primus train spec {spec_name}")
    base = fam.get_train_spec()
    args_cls = type(next(iter(base.model_args.values())))
    return base, args_cls, base.model_cls


_REGISTERED: Dict[str, ts.TrainSpec] = {}


def _construct(cls, values: Dict[str, Any]):
    """Dataclass from a (nested) dict: sub-dicts become the field's dataclass."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for k, v in values.items():
        tp = hints[k]
        kwargs[k] = _construct(tp, v) if isinstance(v, dict) and dataclasses.is_dataclass(tp) else v
    return cls(**kwargs)


def register(spec_name: str, flavor: str, flavor_args: Dict[str, Any]):
    """Make `model.name=spec_name, model.flavor=flavor` resolvable by TorchTitan; returns the ModelArgs."""
    if spec_name not in _REGISTERED:
        base, args_cls, model_cls = _family(spec_name)
        spec = dataclasses.replace(
            base,
            model_cls=model_cls,
            model_args={},
            parallelize_fn=_post_parallelize(base.parallelize_fn),
            build_dataloader_fn=data.build_dataloader,
            build_tokenizer_fn=data.build_tokenizer,
            build_metrics_processor_fn=_build_metrics,
            build_validator_fn=data.build_validator,
            state_dict_adapter=None,  # no HF checkpoint conversion for our custom shapes
        )
        spec.args_cls = args_cls  # remembered for later flavors
        ts.register_train_spec(spec_name, spec)
        _REGISTERED[spec_name] = spec
    spec = _REGISTERED[spec_name]
    # a fresh object each time: TorchTitan's Trainer mutates its flavor args (max_seq_len, MoE flags)
    spec.model_args[flavor] = _construct(spec.args_cls, flavor_args)
    return spec.model_args[flavor]
