"""`backend=megatron`: megatron-core's GPTModel, DDP wrapper, optimizer factory, LR scheduler and pipeline
schedules, driven by the validated config through `args.build_args` (what a dry run prints is what runs).

The step is Megatron-LM's: zero grad buffers, get_forward_backward_func over all micro batches (gradient
accumulation, pipeline schedules, grad sync hooks), optimizer.step (unscale, clip, update), scheduler.step.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from functools import partial
from typing import Any, Dict, List

import torch

from primus.backends.base import StepResult, Trainer
from primus.backends.megatron import args as margs
from primus.config.errors import ConfigError, ConfigIssue

log = logging.getLogger("primus.megatron")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ACTIVATIONS = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}
_DTYPE_KEYS = ("params_dtype", "pipeline_dtype")


def _init_distributed(ctx) -> None:
    if torch.distributed.is_initialized():
        return
    if "MASTER_ADDR" not in os.environ:  # a world of one started without a launcher
        from primus.launch.local import default_to_single_process

        default_to_single_process()
    kw = {}
    if ctx.device == "cuda":
        torch.cuda.set_device(ctx.local_rank)
        # Megatron-LM's own initializer binds the group to the rank's GPU (torch >= 2.3): NCCL then knows the device
        # at every collective instead of guessing it from the current context, and splits subgroups' communicators
        # from the default one rather than bootstrapping each anew.
        kw["device_id"] = torch.device("cuda", ctx.local_rank)
    torch.distributed.init_process_group(backend=ctx.dist_backend, init_method="env://",
                                         world_size=int(os.environ.get("WORLD_SIZE", ctx.world_size)),
                                         rank=int(os.environ.get("RANK", ctx.rank)), **kw)


def _mcore_error(what: str, e: Exception, keys: List[str]) -> ConfigError:
    return ConfigError(ConfigIssue(keys, str(e), f"megatron-core {margs.mcore_version()} refused the {what}",
                                   "change the listed settings (see the message)"))


def transformer_config_from(kw: Dict[str, Any]):
    """args["transformer_config"] -> megatron's (MLA)TransformerConfig; its own checks become ConfigErrors."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    kw = dict(kw)
    for k in _DTYPE_KEYS:
        kw[k] = _DTYPES[kw[k]]
    kw["activation_func"] = _ACTIVATIONS[kw["activation_func"]]
    if kw.get("window_size") is not None:  # a list in args (JSON); megatron and TE index a tuple
        kw["window_size"] = tuple(kw["window_size"])
    cls = MLATransformerConfig if kw.get("multi_latent_attention") else TransformerConfig
    try:
        return cls(**kw)
    except (AssertionError, ValueError, TypeError) as e:
        raise _mcore_error("transformer config", e, ["model", "parallel", "recompute", "precision", "moe"]) from e


def ddp_config_from(kw: Dict[str, Any]):
    from megatron.core.distributed import DistributedDataParallelConfig

    try:
        return DistributedDataParallelConfig(**kw)
    except (AssertionError, ValueError, TypeError) as e:
        raise _mcore_error("DDP config", e, ["overlap", "memory"]) from e


def optimizer_config_from(kw: Dict[str, Any]):
    from megatron.core.optimizer import OptimizerConfig

    kw = dict(kw)
    kw["params_dtype"] = _DTYPES[kw["params_dtype"]]
    try:
        return OptimizerConfig(**kw)
    except (AssertionError, ValueError, TypeError) as e:
        raise _mcore_error("optimizer config", e, ["training", "memory"]) from e


class MegatronTrainer(Trainer):
    name = "megatron"

    # ------------------------------------------------------------------------------------------------ setup

    def setup(self) -> Dict[str, Any]:
        from primus.backends.megatron.patches.deferred_compile import import_megatron_core

        import_megatron_core()  # before any megatron import: its torch.compile decorations deferred
        cfg, ctx = self.cfg, self.ctx
        self.args = a = margs.build_args(cfg, ctx)
        for k, v in a["env"].items():  # before the first CUDA/NCCL call creates the context
            os.environ[k] = v
            ctx.env[k] = v
        # a caller that brought its own process group (several layouts in one launch) keeps it after close()
        self._owns_pg = not torch.distributed.is_initialized()
        _init_distributed(ctx)

        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel
        from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
        from megatron.core.models.gpt import GPTModel
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.module import Float16Module

        from primus.backends.megatron import data as mdata
        from primus.backends.megatron import patches, spec
        from primus.backends.megatron.init import layout_independent_init
        from primus.features import recompute

        cpu = ctx.device == "cpu"
        applied = patches.apply(ctx.device, a)  # megatron-core's upstream workarounds (patches/__init__.py)
        self.multi_tensor_swaps = applied.get("megatron.optimizer.foreach_multi_tensor") or []
        from primus.backends.megatron import fusions

        fusions.configure(rope=a["rope_fusion"] == "triton", swiglu=a["activation_fusion"] == "triton")
        from primus.backends.megatron import perf

        if a["compile"]:
            perf.enable_dynamo()  # the CPU redirections turn dynamo off

        ps.initialize_model_parallel(**a["parallel_state"])
        self.ps = ps
        seed = a["seed"]
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)

        self.tconfig = tconfig = self._transformer_config(a["transformer_config"])
        use_te = a["layer_spec"] == "te"
        if use_te:
            import transformer_engine  # noqa: F401 - confirm it imports, not only that it is installed
        turbo_info = self._turbo_setup()
        self.spec_name = spec.describe(use_te)
        if ctx.is_rank0:
            log.info("megatron layer spec: %s", self.spec_name)

        from tuning.apply import is_installed as tuned_stage3_installed

        tuned_stage3 = tuned_stage3_installed()
        vp = a["parallel_state"]["virtual_pipeline_model_parallel_size"]
        chunks = []
        self.kept_init = []
        self.fp8_converted = 0
        for vp_stage in (range(vp) if vp else [None]):
            block = spec.decoder_block_spec(tconfig, use_te, vp_stage=vp_stage, turbo=a["turbo"])
            first = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
            last = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
            model = GPTModel(config=tconfig, transformer_layer_spec=block, pre_process=first, post_process=last,
                             mtp_block_spec=spec.mtp_block_spec(tconfig, block, use_te, vp_stage=vp_stage),
                             vp_stage=vp_stage, **a["gpt_model"])
            self.kept_init += layout_independent_init(model, tconfig, seed)
            if a["turbo"]:
                self._turbo_apply(model)
            if self.fp8_hook is not None and not a["turbo"].get("use_turbo_parallel_linear"):
                self.fp8_converted += len(self.fp8_hook(model, self.fp8_settings, tconfig))
            if tuned_stage3:  # tuning stage 3 on CUDA: train_loop installed the tuned executor (tuned_gemm.py)
                from primus.backends.megatron import tuned_gemm

                self.tuned_linears = getattr(self, "tuned_linears", 0) + tuned_gemm.apply(model)
            if a["recompute_layer_ids"]:
                recompute.apply(model, a["recompute_layer_ids"])
            if a["turbo_loss"]:
                self.turbo_loss = perf.turbo_loss(model) or getattr(self, "turbo_loss", False)
            if a["compile"]:
                before = getattr(self, "compiled_layers", 0)
                self.compiled_layers = before + perf.compile_layers(model, before)
                if a["compile_loss"]:
                    self.compiled_loss = perf.compile_loss(model) or getattr(self, "compiled_loss", False)
            if not cpu:
                model.cuda(torch.cuda.current_device())
            chunks.append(model)
        self.params = self._count_params(chunks)

        if tconfig.fp16 or tconfig.bf16:
            chunks = [Float16Module(tconfig, m) for m in chunks]
        ddp_config = ddp_config_from(a["ddp_config"])
        self.model = [DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=m,
                                              disable_bucketing=i > 0)  # Megatron-LM: bucket the first chunk only
                      for i, m in enumerate(chunks)]

        opt_config = optimizer_config_from(a["optimizer_config"])
        import megatron.core.optimizer as mopt  # looked up now: on CPU a workaround wraps the factory

        self.optimizer = mopt.get_megatron_optimizer(opt_config, self.model)
        self.scheduler = OptimizerParamScheduler(self.optimizer, **a["scheduler"])
        self.fused_optimizer = []
        if a["fused_adamw"]:
            from primus.backends.megatron import perf

            self.fused_optimizer = perf.fused_adamw(self.optimizer)
        from primus.backends.megatron import offload_split

        # the offloaded step's CPU Adam and its waits on the GPU, timed apart (result.json's optimizer_split_s);
        # None where nothing is offloaded
        self._offload_split = offload_split.install(self.optimizer)

        self._wire_sync_hooks(tconfig, finalize_model_grads)
        self.fb_func = get_forward_backward_func()
        if cpu:
            patches.refresh()  # modules megatron imported lazily while building

        dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        dataset, self.valid_dataset = mdata.build_datasets(cfg, ctx, a,
                                                           cache_dir=os.path.join(ctx.run_dir, "data", "cache"))
        self.data_device = device = "cpu" if cpu else f"cuda:{torch.cuda.current_device()}"
        # one iterator per model chunk: each chunk takes the same micro batches in the same order
        self.iters = [mdata.MicroBatches(dataset, a["schedule"]["micro_batch_size"], dp_rank, dp, device,
                                         a["data"]["num_workers"]) for _ in self.model]
        from primus.backends.megatron import checkpoint as mckpt  # issue 9: on_nonfinite=skip

        self._guard = mckpt.nonfinite_guard(self)
        info = {
            "params": self.params,
            "layer_spec": self.spec_name,
            "megatron_core": margs.mcore_version(),
            "schedule": a["schedule"]["forward_backward_func"],
            "num_microbatches": a["schedule"]["num_microbatches"],
            "parallel": {**a["parallel_state"], "dp": dp},
        }
        if not use_te:
            info["sdpa_backends"] = list(spec.sdpa_backends())
        if a["rope_fusion"]:
            info["rope_fusion"] = {"te": "Transformer Engine", "triton": "primus.turbo.rope (Triton)"}[a["rope_fusion"]]
        if a["activation_fusion"]:
            info["activation_fusion"] = {"jit": "megatron jit (torch.compile)",
                                         "triton": "primus.turbo.swiglu (Triton)"}[a["activation_fusion"]]
        if a["fp8_backend"]:
            info["fp8_backend"] = a["fp8_backend"]
        self.weight_casts = self._weight_casts(bool(a["fp8_weight_cache"]) and self.fp8_hook is not None)
        if self.fp8_hook is not None:
            info["fp8_linears_on_this_rank"] = self.fp8_converted
            info["fp8_weight_cache"] = self.weight_casts is not None
            from primus.backends.megatron import fp8 as mfp8

            info["fp8_fused_mlps"] = sum(mfp8.fused_mlps(c) for c in chunks)
            if tconfig.num_moe_experts and tconfig.moe_grouped_gemm:
                fp8_gg = a["turbo"].get("grouped_gemm_fp8")
                if fp8_gg:  # which fp8 grouped GEMM the experts' two GEMMs run here (grouped_gemm_fp8's rule)
                    from primus.backends.megatron import turbo as mturbo

                    info["fp8_experts"] = mturbo.fp8_experts_info(tconfig, device, fp8_gg)
                    warning = mturbo.small_experts_warning(tconfig)
                    if warning:
                        log.warning(warning)
                else:
                    info["fp8_experts"] = ("bf16 grouped GEMM (turbo.grouped_gemm_fp8=true runs them in fp8: "
                                           "torch._scaled_grouped_mm with precision.fp8=e4m3 on sm90, else primus' "
                                           "Triton kernel, slower than the bf16 one on the H200)")
        if self.kept_init:
            info["megatron_init_params"] = len(self.kept_init)
        info.update(self._turbo_built(turbo_info))
        from primus.features.turbo import moe_dispatch_info

        moe_dispatch = moe_dispatch_info(cfg)  # sync-free or not, and what it would need (features/turbo.py)
        if moe_dispatch is not None:
            info["moe_dispatch"] = moe_dispatch
            if ctx.is_rank0:
                log.info("MoE dispatch: %s", moe_dispatch)
        from primus.features.training import experts_grad_accum_info

        experts_accum = experts_grad_accum_info(cfg)  # training.gradient_accumulation_fusion on the MoE experts
        if experts_accum is not None:
            info["experts_grad_accum"] = experts_accum
        if tuned_stage3:
            info["tuned_gemm_linears"] = getattr(self, "tuned_linears", 0)
        if a["compile"]:
            info["compiled_layers"] = self.compiled_layers
            info["compiled_loss"] = getattr(self, "compiled_loss", False)
        if a["turbo_loss"]:  # True on the ranks holding the last stage
            info["turbo_loss"] = getattr(self, "turbo_loss", False)
        if self.multi_tensor_swaps:  # patches/optimizer.py: megatron's local per-tensor loops -> torch foreach kernels
            info["optimizer_multi_tensor"] = "torch foreach: " + ", ".join(self.multi_tensor_swaps)
        if self.fused_optimizer:
            info["optimizer_impl"] = "torch fused " + "/".join(sorted(set(self.fused_optimizer)))
        return info

    def _turbo_setup(self) -> Dict[str, Any]:
        """turbo.* flags (turbo.py): providers resolved (ConfigError naming what to install) and logged, megatron's
        MoE entry points patched; the spec and the built chunks are swapped in setup()."""
        flags = self.args["turbo"]
        if not flags:
            # an earlier run in this process (a sweep point) patched megatron's MoE entry points: they follow the
            # flags of the run at hand, none here, or this run would get that run's turbo kernels
            earlier = sys.modules.get("primus.backends.megatron.turbo")
            if earlier is not None:
                earlier.reset({})
            return {}
        from primus.backends.megatron import turbo as mturbo
        from primus.turbo.providers import log_providers

        mapping = mturbo.resolve(self.cfg, self.ctx)
        if self.ctx.is_rank0:
            log_providers(mapping, log)
        mturbo.reset(flags)
        mturbo.install()
        return {"turbo_providers": mapping}

    def _turbo_apply(self, model) -> None:
        from primus.backends.megatron import turbo as mturbo

        mturbo.apply(model, self.tconfig, self.fp8_settings if self.fp8_hook is not None else None)
        for k, v in mturbo.count_modules(model).items():
            if v:
                mturbo.SWAPS[k] = mturbo.SWAPS.get(k, 0) + v

    def _turbo_built(self, turbo_info: Dict[str, Any]) -> Dict[str, Any]:
        if not turbo_info:
            return {}
        from primus.backends.megatron import turbo as mturbo

        missing = mturbo.check_swapped(self.args["turbo"], mturbo.SWAPS)
        if missing:
            from primus.features.turbo import swap_key

            raise ConfigError([ConfigIssue([swap_key(k)], True, "found nothing to swap in this model",
                                           "turn the flag off") for k in missing])
        return {**turbo_info, "turbo_swaps": dict(mturbo.SWAPS)}

    def _transformer_config(self, kw: Dict[str, Any]):
        kw = dict(kw)
        self._plug_low_precision(kw)
        return transformer_config_from(kw)

    def _plug_low_precision(self, kw: Dict[str, Any]) -> None:
        """fp8/fp4 run through TE when the TE spec is in use. Otherwise the project's portable fp8 linear takes
        them (fp8.py): megatron must not see the fp8 fields (it would route them to TE); each built model chunk is
        converted by one call, `fp8.apply(model, settings, config)`."""
        self.fp8_hook, self.fp8_settings = None, {}
        if self.args["fp8_backend"] != "portable":
            return
        keys = [k for k in kw if k.startswith(("fp8", "fp4")) or k in (
            "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")]
        self.fp8_settings = {k: kw.pop(k) for k in keys}
        self.fp8_settings["fused_mlp"] = self.args["fp8_fused_mlp"]
        self.fp8_settings["grad_accum_fusion"] = self.args["fp8_grad_accum_fusion"]
        if "fp4" in self.fp8_settings or not margs.portable_fp8_available(self.fp8_settings.get("fp8_recipe")):
            raise ConfigError(ConfigIssue(["precision.fp8", "precision.fp8_recipe"], self.fp8_settings,
                                          "portable fp8 linear not available here for this recipe "
                                          "(primus.turbo.fp8_linear), and Transformer Engine is not installed",
                                          "use precision=bf16, or install Transformer Engine"))
        from primus.backends.megatron import fp8

        self.fp8_hook = fp8.apply

    @staticmethod
    def _weight_casts(on: bool):
        """The portable fp8 linears' weight-cast cache (primus.turbo.fp8_linear.WEIGHT_CASTS), on or off for this
        run. train_step clears it after the step's forwards and backwards, before the optimizer step, so casts live
        only inside one step's forward/backward: a checkpoint load or an optimizer step never meets one."""
        import sys

        if not on and "primus.turbo.fp8_linear" not in sys.modules:  # nothing to turn off (and no Triton import)
            return None
        from primus.turbo.fp8_linear import WEIGHT_CASTS

        WEIGHT_CASTS.enable(on)
        if on:
            log.info("fp8 weight cache on: each weight cast once a step, reused by its other forwards "
                     "(precision.fp8_weight_cache)")
        return WEIGHT_CASTS if on else None

    def _wire_sync_hooks(self, tconfig, finalize_model_grads) -> None:
        """As Megatron-LM's training loop does: let the schedules drive grad/param sync of the DDP chunks."""
        a, ov = self.args, self.cfg.overlap
        one = len(self.model) == 1

        def pick(fns):
            return fns[0] if one else fns

        tconfig.grad_scale_func = self.optimizer.scale_loss
        if ov.overlap_grad_reduce:
            tconfig.no_sync_func = pick([m.no_sync for m in self.model])
            if a["schedule"]["align_grad_reduce"]:
                tconfig.grad_sync_func = pick([m.start_grad_sync for m in self.model])
        if ov.overlap_param_gather and a["schedule"]["align_param_gather"]:
            tconfig.param_sync_func = pick([m.start_param_sync for m in self.model])
        tconfig.finalize_model_grads_func = finalize_model_grads

    def _count_params(self, chunks) -> int:
        """Parameters of the whole model: each counted once over tp/dp/ep replicas and the tied-output copy."""
        ps = self.ps
        n = 0
        for model in chunks:
            for p in model.parameters():
                if getattr(p, "shared_embedding", False) and getattr(p, "shared", False) \
                        and not ps.is_pipeline_first_stage(ignore_virtual=True):
                    continue  # the last stage's copy of a tied embedding
                expert = not getattr(p, "allreduce", True)
                sharded = getattr(p, "tensor_model_parallel", False)
                if expert:
                    if ps.get_expert_data_parallel_rank() != 0:
                        continue
                    if not sharded and ps.get_expert_tensor_parallel_rank() != 0:
                        continue
                else:
                    if ps.get_data_parallel_rank(with_context_parallel=True) != 0:
                        continue
                    if not sharded and ps.get_tensor_model_parallel_rank() != 0:
                        continue
                n += p.numel()
        t = torch.tensor([n], dtype=torch.float64, device=self._device())
        torch.distributed.all_reduce(t)
        return int(t.item())

    def _device(self):
        return "cpu" if self.ctx.device == "cpu" else torch.device("cuda", torch.cuda.current_device())

    # ------------------------------------------------------------------------------------------------ step

    def _loss_func(self, loss_mask, output_tensor):
        losses = output_tensor.float().view(-1)
        mask = loss_mask.view(-1).float()
        loss = torch.sum(losses * mask) / mask.sum().clamp(min=1.0)
        if getattr(self, "_nan_step", False):  # TEST HOOK PRIMUS_INJECT_NAN_AT_STEP (primus/fault_injection.py)
            loss = loss * float("nan")
        # the schedule scales the returned loss in place: report a copy
        return loss, {"lm loss": loss.detach().clone()}

    def _forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
        return out, partial(self._loss_func, batch["loss_mask"])

    def train_step(self, step: int) -> StepResult:
        a, ps = self.args, self.ps
        s = a["schedule"]
        from primus import fault_injection

        self._nan_step = fault_injection.nan_at(step)
        # the optimizer step's first device read waits for the backward anyway: a sync on each side of it costs
        # nothing and splits the step into its GPU part and its optimizer part (CPU Adam and transfers if offloaded)
        sync = torch.cuda.synchronize if self.ctx.device == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        for m in self.model:
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        lr = self.optimizer.param_groups[0]["lr"]
        losses = self.fb_func(
            forward_step_func=self._forward_step,
            data_iterator=self.iters if len(self.iters) > 1 else self.iters[0],
            model=self.model if len(self.model) > 1 else self.model[0],
            num_microbatches=s["num_microbatches"],
            seq_length=s["seq_length"],
            micro_batch_size=s["micro_batch_size"],
            decoder_seq_length=s["seq_length"],
            forward_only=False,
        )
        if self.weight_casts is not None:  # the optimizer step changes the weights; their casts' memory is free
            self.weight_casts.clear()
        level = a["empty_unused_memory_level"]
        if level >= 2 and self.ctx.device == "cuda":
            torch.cuda.empty_cache()
        sync()
        t1 = time.perf_counter()
        split = self._offload_split
        if split is not None:
            split.start()
        ok, grad_norm, _ = self.optimizer.step()
        sync()
        phases = {"forward_backward_s": t1 - t0, "optimizer_s": time.perf_counter() - t1}
        parts = split.parts(phases["optimizer_s"]) if split is not None else {}
        if not ok and grad_norm is None and getattr(self, "_guard", None) is not None:
            grad_norm = self._guard.last_norm  # skipped by the non-finite guard: report the norm it saw
        if ok:
            self.scheduler.step(increment=1)
        if level >= 1 and self.ctx.device == "cuda":
            torch.cuda.empty_cache()
        scale = float(self.optimizer.get_loss_scale()) if self.cfg.precision.fp16 else None
        return StepResult(loss=self._global_loss(losses), grad_norm=None if grad_norm is None else float(grad_norm),
                          lr=float(lr), skipped=not ok, loss_scale=scale, phases=phases, optimizer_split=parts)

    def evaluate(self, step: int):
        """Forward only over training.eval_iters global batches of the validation split, read from its start each
        time (so evaluations at different steps compare the same batches); the mean of their global losses."""
        if self.valid_dataset is None:
            return None
        from primus.backends.megatron import data as mdata

        s, ps = self.args["schedule"], self.ps
        iters = [mdata.MicroBatches(self.valid_dataset, s["micro_batch_size"], ps.get_data_parallel_rank(),
                                    ps.get_data_parallel_world_size(), self.data_device,
                                    self.args["data"]["num_workers"]) for _ in self.model]
        self._nan_step = False
        for m in self.model:
            m.eval()
        values = []
        try:
            with torch.no_grad():
                for _ in range(self.args["eval"]["iters"]):
                    losses = self.fb_func(
                        forward_step_func=self._forward_step,
                        data_iterator=iters if len(iters) > 1 else iters[0],
                        model=self.model if len(self.model) > 1 else self.model[0],
                        num_microbatches=s["num_microbatches"], seq_length=s["seq_length"],
                        micro_batch_size=s["micro_batch_size"], decoder_seq_length=s["seq_length"],
                        forward_only=True)
                    values.append(self._global_loss(losses))
        finally:
            for m in self.model:
                m.train()
        return sum(values) / len(values)

    def _global_loss(self, losses) -> float:
        """Mean LM loss of the global batch, the same value on every rank (one all-reduce over the world)."""
        ps = self.ps
        t = torch.zeros(2, dtype=torch.float64, device=self._device())
        if ps.is_pipeline_last_stage(ignore_virtual=True) and ps.get_tensor_model_parallel_rank() == 0 \
                and ps.get_context_parallel_rank() == 0 and losses:
            t[0] = torch.stack([x["lm loss"].double() for x in losses]).mean()
            t[1] = 1.0
        torch.distributed.all_reduce(t)
        return float(t[0] / t[1])

    def save_checkpoint(self, path: str, step: int) -> Dict[str, Any]:
        from primus.backends.megatron import checkpoint as mckpt

        return mckpt.save(self, path, step)

    def load_checkpoint(self, path: str, meta=None) -> Dict[str, Any]:
        from primus.backends.megatron import checkpoint as mckpt

        return mckpt.load(self, path)

    def close(self) -> None:
        if getattr(self, "weight_casts", None) is not None:  # a later run in this process (a sweep) starts clean
            self.weight_casts.enable(False)
        try:
            self.ps.destroy_model_parallel()
        except Exception:  # noqa: BLE001
            pass
        if getattr(self, "_owns_pg", True) and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
