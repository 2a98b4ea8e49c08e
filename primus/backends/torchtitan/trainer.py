"""Drive TorchTitan's own `torchtitan.train.Trainer` one step at a time for the shared loop.

TorchTitan builds everything (distributed init, meshes, model + converters, parallelisms, optimizer, LR schedule,
data) from a JobConfig; we hand it one parsed by its own ConfigManager from a TOML file written to the run dir
(`torchtitan_job.toml`, runnable with TorchTitan's CLI too). Each `train_step` runs the body of TorchTitan's
`Trainer.train` loop for one step, so its code does the forward, backward, clipping and optimizer step.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
from datetime import timedelta
from typing import Any, Dict

from primus.backends.base import StepResult, Trainer
from primus.backends.torchtitan import PINNED_VERSION, args as tt_args, flavors
from primus.backends.torchtitan.jobconfig_keys import (
    EXTRA_KEYS, FLAVOR_KEY, TURBO_KEY, UnknownTorchTitanKey, installed_version, runtime_problems, static_problems,
)
from primus.config.errors import ConfigError
from primus.launch.local import default_to_single_process


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def to_toml(sections: Dict[str, Any]) -> str:
    """Nested dict -> TOML tables. None values are left out (TorchTitan's default applies; TOML has no null)."""
    lines = []

    def table(name: str, d: Dict[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict) and v is not None}
        if scalars:
            lines.append(f"[{name}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
            lines.append("")
        for k, v in d.items():
            if isinstance(v, dict):
                table(f"{name}.{k}", v)

    for name, d in sections.items():
        table(name, d)
    return "\n".join(lines)


@contextlib.contextmanager
def _quiet_torchtitan():
    """TorchTitan logs through the root logger (which Hydra sets to INFO): keep its info lines (config dumps,
    mesh building, GC notes) out of the run log while its code runs; warnings still show."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(level)


class TorchTitanTrainer(Trainer):
    name = "torchtitan"

    def setup(self) -> Dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        issues = [i for i in tt_args.capability_issues(cfg, ctx) if i.severity == "error"]
        if issues:
            raise ConfigError(issues)
        args = tt_args.build_args(cfg, ctx)

        # torchtitan initialises torch.distributed itself from the env:// variables; a bare 1-process run has none
        default_to_single_process()
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # offline only: never reach a hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")

        import torch

        from primus.backends.torchtitan import patches

        # TorchTitan's upstream workarounds (patches/__init__.py) before the key check below, which imports
        # TorchTitan: their deferred imports (compile, datasets) only defer anything as its first import
        patches.apply(ctx.device)
        problems = static_problems(args) + runtime_problems(args)
        if problems:
            raise UnknownTorchTitanKey(sorted(set(problems)))
        from primus.backends.torchtitan import data as tt_data, spec
        from torchtitan.config import ConfigManager
        from torchtitan.train import Trainer as TTTrainer

        self._owns_pg = not torch.distributed.is_initialized()
        model = args["model"]
        self.model_args = spec.register(model["name"], model["flavor"], args[FLAVOR_KEY])
        job = {k: v for k, v in args.items() if k not in EXTRA_KEYS}
        turbo_info = self._turbo_setup(args)
        os.makedirs(job["job"]["dump_folder"], exist_ok=True)
        self.toml_path = os.path.join(ctx.run_dir, "torchtitan_job.toml")
        # every rank writes the same text; the atomic replace keeps a reader from seeing half a file
        with open(self.toml_path + f".{ctx.rank}", "w") as f:
            f.write(to_toml(job))
        os.replace(self.toml_path + f".{ctx.rank}", self.toml_path)
        self.job_config = ConfigManager().parse_args(["--job.config_file", self.toml_path])

        tt_data.configure(self._eod_id(cfg) if cfg.data.eod_mask_loss else None)
        with _quiet_torchtitan():
            self.tt = TTTrainer(self.job_config)
        self._check_built(cfg)
        self.tt.checkpointer.load(step=self.job_config.checkpoint.load_step)
        self._data = self._batches()
        from primus.backends.torchtitan import checkpoint as tt_ckpt  # issue 9: NaN test hook, on_nonfinite=skip

        self._nan = tt_ckpt.NaNInjector(self.tt)
        self._guard = tt_ckpt.nonfinite_guard(self.tt, cfg)
        pd = self.tt.parallel_dims
        return {
            "params": self._param_count(),
            "torchtitan_version": installed_version(),
            "torchtitan_model": f"{model['name']}/{model['flavor']}",
            "torchtitan_flops_per_token": self.tt.metrics_processor.num_flops_per_token,
            "gradient_accumulation_steps": self.tt.gradient_accumulation_steps,
            "parallel_dims": {"dp_shard": pd.dp_shard, "dp_replicate": pd.dp_replicate, "tp": pd.tp,
                              "pp": pd.pp, "cp": pd.cp, "ep": pd.ep},
            "job_config_toml": self.toml_path,
            **self._turbo_built(turbo_info),
        }

    def _eod_id(self, cfg) -> int:
        """data.eod_mask_loss: the end-of-document id (the tokenizer's; synthetic data: vocab_size - 1, as
        megatron's null tokenizer)."""
        if cfg.data.kind.value == "synthetic":
            return cfg.model.vocab_size - 1
        from primus.backends.torchtitan import data as tt_data

        tok = tt_data.build_tokenizer(self.job_config)
        return tok.eos_id

    def _batches(self):
        from primus.backends.torchtitan import data as tt_data

        return tt_data.masked_batches(self.tt.batch_generator(self.tt.dataloader))

    def evaluate(self, step: int):
        """TorchTitan's Validator over the held-out data (training.eval_iters batches); None when not evaluating."""
        tt = self.tt
        validator = getattr(tt, "validator", None)
        if validator is None:
            return None
        with _quiet_torchtitan():
            validator.validate(tt.model_parts, tt.step)
        return tt.metrics_processor.last_validation["loss"]

    def _turbo_setup(self, args) -> Dict[str, Any]:
        """Who serves each enabled turbo flag (logged at start-up, kept in backend_info); our model converters
        (turbo.py, named in model.converters) get their settings before TorchTitan builds the model."""
        cfg, ctx = self.cfg, self.ctx
        if not cfg.turbo.enable_primus_turbo:
            return {}
        from primus.backends.torchtitan import turbo
        from primus.turbo.providers import log_providers, resolve_providers

        mapping = resolve_providers(cfg.turbo, cfg.precision, ctx.device, "torchtitan", moe_cfg=cfg.moe)
        if ctx.is_rank0:
            log_providers(mapping)
        turbo.configure(args.get(TURBO_KEY))
        return {"turbo_providers": mapping}

    def _turbo_built(self, turbo_info: Dict[str, Any]) -> Dict[str, Any]:
        if not turbo_info:
            return {}
        from primus.backends.torchtitan import turbo

        info = {**turbo_info, "turbo_swaps": dict(turbo.LAST_SWAPS)}
        delayed = sum(turbo.allocate_fp8_states(part) for part in self.tt.model_parts)  # before the first trace
        if delayed:
            info["fp8_delayed_states"] = delayed
        return info

    def _check_built(self, cfg) -> None:
        """What TorchTitan built must be our model: FFN width (derived from dim in llama3) and vocabulary."""
        m = cfg.model
        if not m.num_experts and not m.multi_latent_attention:
            for name, mod in self.tt.model_parts[0].named_modules():
                if name.endswith("feed_forward.w1"):
                    assert mod.out_features == m.ffn_hidden_size, (
                        f"torchtitan built FFN {mod.out_features}, config says {m.ffn_hidden_size}")
                    break
        tok = self.tt.tokenizer
        if tok is not None and tok.get_vocab_size() > m.vocab_size:
            from primus.config.errors import ConfigIssue

            raise ConfigError(ConfigIssue(["data.tokenizer", "model.vocab_size"], tok.get_vocab_size(),
                                          "the tokenizer has more tokens than the model's vocabulary",
                                          f"use a tokenizer of at most {m.vocab_size} tokens"))

    def _param_count(self) -> int:
        import torch

        # DTensor numel is the global size, so FSDP/TP shards count once; pp stages hold disjoint layers
        n = sum(p.numel() for part in self.tt.model_parts for p in part.parameters())
        if self.tt.parallel_dims.pp_enabled:
            t = torch.tensor([n], dtype=torch.int64, device=self.tt.device)  # nccl needs device tensors
            torch.distributed.all_reduce(t, group=self.tt.parallel_dims.get_mesh("pp").get_group())
            n = int(t.item())
        return n

    def train_step(self, step: int) -> StepResult:
        import torch
        from torchtitan.distributed import utils as dist_utils

        tt = self.tt
        tt.step += 1
        tt.gc_handler.run(tt.step)
        tt.metrics_processor.last = None
        from primus import fault_injection

        self._nan.on = fault_injection.nan_at(step)
        with _quiet_torchtitan():
            tt.train_step(self._data)
            tt.checkpointer.save(tt.step, last_step=(tt.step == self.job_config.training.steps))
            if tt.step == 1:
                # as TorchTitan's loop: shorter collective timeouts once compilation and lazy init are done
                dist_utils.set_pg_timeouts(timedelta(seconds=self.job_config.comm.train_timeout_seconds),
                                           tt.parallel_dims)
        last = tt.metrics_processor.last
        assert last is not None, "torchtitan did not report the step's metrics"
        loss = last["loss"]
        if tt.parallel_dims.pp_enabled:
            # only the last stage computes the loss (others report -1): share it so every rank returns it
            t = torch.tensor([loss], dtype=torch.float64, device=tt.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            loss = float(t.item())
        if tt.device.type == "cuda":
            torch.cuda.synchronize()
        return StepResult(loss=loss, grad_norm=last["grad_norm"], lr=float(last["lr"]),
                          skipped=bool(self._guard and self._guard.skipped))

    def save_checkpoint(self, path: str, step: int) -> Dict[str, Any]:
        from primus.backends.torchtitan import checkpoint as tt_ckpt

        return tt_ckpt.save(self.tt, path, step, with_optim=not self.cfg.checkpoint.no_save_optim)

    def load_checkpoint(self, path: str, meta=None) -> Dict[str, Any]:
        from primus.backends.torchtitan import checkpoint as tt_ckpt

        out = tt_ckpt.load(self.tt, path, (meta or {}).get("layout"), with_optim=not self.cfg.checkpoint.no_load_optim)
        self._data = self._batches()  # a fresh iterator from the restored position
        return out

    def close(self) -> None:
        import torch

        tt = getattr(self, "tt", None)
        if tt is not None:
            tt.close()
            self.tt = None
        gc.enable()  # TorchTitan's GarbageCollection disabled automatic gc for the process
        if getattr(self, "_owns_pg", False) and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


__all__ = ["TorchTitanTrainer", "PINNED_VERSION", "flavors"]
