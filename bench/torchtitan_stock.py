"""Stock TorchTitan 0.2.2 as a peer: its own Trainer and train spec, configured by a toml built from its defaults.

What differs from `python -m torchtitan.train --job.config_file x.toml` with TorchTitan's own model family:
- the model's shape: one flavor added to the family's own flavor table, built from a preset of conf/model/ (the
  same sizes as `train.py model=<name>`; TorchTitan's flavors have no Llama-2-7B or DeepSeek-V2-Lite);
- MoE: the router's shape (experts, top-k, shared experts, score function) is the preset's; the rest is TorchTitan's
  MoEArgs default (grouped GEMM, aux-loss-free balancing bias 1e-3). DeepSeek-V2-Lite (MLA) runs in its
  deepseek_v3 family; Qwen3-30B-A3B (GQA with QK-norm, which deepseek_v3's MLA cannot express) in its qwen3 family,
  whose MoE layer is the same torchtitan.models.moe module;
- the data: the synthetic token stream train.py uses (TorchTitan's default dataset and tokenizer are downloads an
  offline GPU machine does not have);
- on a machine without a GPU only: the project's CPU redirections (device type, memory monitor, gloo), so that this
  script checks itself on a CPU at the debug shape.
Everything else is TorchTitan's default (AdamW, its LR schedule, grad clipping 1.0, fp32 params, bf16 autocast or
FSDP mixed precision), plus what the flags ask for: `--compile` (model and loss), `--float8` (torchao float8
tensorwise, the output layer kept bf16, as its docs recommend), `--ac none|selective|full`, `--offload`
(training.enable_cpu_offload: TorchTitan offloads through FSDP2 only, i.e. with more than one GPU; with one process
it is refused).

Prints one JSON line in the format of bench/reference.py (tokens/s from TorchTitan's own "tps", the median over
the timed steps; TFLOP/s and MFU by the project's formulas, so that every row of a table counts FLOPs alike).

    python bench/torchtitan_stock.py --shape llama3_8b --batch 1 --global-batch 256 --compile --float8 --steps 3
    python bench/torchtitan_stock.py --shape deepseek_v2_lite --layers 10 --batch 1 --compile
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FLAVOR = "primus_bench"
FAMILY = {"primus_llama3": "llama3", "primus_qwen3": "qwen3", "primus_deepseek_v3": "deepseek_v3"}


def compose(shape: str, layers, seq: int):
    """The preset's typed config, as `train.py model=<shape>` composes it."""
    from hydra import compose as hcompose, initialize_config_dir
    from omegaconf import OmegaConf

    from primus.config.schema import PrimusConfig, register

    register()
    # no loss-based balancing: TorchTitan's MoE balances by its own expert bias (set below to its default)
    ov = [f"model={shape}", "backend=torchtitan", f"training.seq_length={seq}",
          "moe.moe_router_load_balancing_type=none"]
    if layers:
        ov.append(f"model.num_layers={layers}")
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        d = hcompose("config", overrides=ov)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrimusConfig), d))
    if seq > cfg.model.max_position_embeddings:
        cfg.model.max_position_embeddings = seq
    return cfg


def toml_text(sections) -> str:
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return json.dumps(str(v))

    return "\n".join(f"[{name}]\n" + "".join(f"{k} = {val(v)}\n" for k, v in body.items())
                     for name, body in sections.items())


def job_sections(args, family: str, out_dir: str, gpu: bool):
    from primus.features.data import SYNTHETIC_DATASET

    s = {
        "job": {"dump_folder": out_dir, "description": f"stock torchtitan peer: {args.shape}"},
        "metrics": {"log_freq": 1, "enable_tensorboard": False},
        "model": {"name": family, "flavor": FLAVOR, "converters": ["quantize.linear.float8"] if args.float8 else []},
        "lr_scheduler": {"warmup_steps": 2},
        "training": {"local_batch_size": args.batch, "global_batch_size": args.global_batch or args.batch,
                     "seq_len": args.seq, "steps": args.warmup + args.steps, "dataset": SYNTHETIC_DATASET,
                     "enable_cpu_offload": args.offload},
        "compile": {"enable": args.compile, "components": ["model", "loss"]},
        "activation_checkpoint": {"mode": args.ac},
        "checkpoint": {"enable": False},
    }
    if args.float8:
        # emulate: the float8 casts without fp8 GEMMs, so that the CPU check runs the same converter
        s["quantize.linear.float8"] = {"recipe_name": "tensorwise", "filter_fqns": ["output"], "emulate": not gpu}
    return s


class TpsRecords(logging.Handler):
    """TorchTitan's per-step console line ('step: N ... tps: 12,345 ...'): the steps and their tps."""

    ANSI = re.compile(r"\x1b\[[0-9;]*m")
    LINE = re.compile(r"step:\s*(\d+).*?loss:\s*([-\d.naif]+).*?tps:\s*([\d,]+)")

    def __init__(self):
        super().__init__()
        self.steps = []

    def emit(self, record):
        m = self.LINE.search(self.ANSI.sub("", record.getMessage()))
        if m:
            self.steps.append((int(m.group(1)), float(m.group(2)), float(m.group(3).replace(",", ""))))


def run_peak(monitor_cls, read):
    """The peak of `read()` (torch's max_memory_allocated) over the whole run, for a monitor class that resets it.

    TorchTitan 0.2.2's MetricsProcessor calls DeviceMemoryMonitor.reset_peak_stats after each log line, so the
    allocator's peak read at the end covers only what ran after the last one: the model's and Adam's states, not the
    step's activations. Each reset first folds the peak so far into a running maximum; returns a reader of the
    run's peak.
    """
    seen = [0]
    reset = monitor_cls.reset_peak_stats

    def folded(self):
        seen[0] = max(seen[0], read())
        reset(self)

    monitor_cls.reset_peak_stats = folded
    return lambda: max(seen[0], read())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3_8b", help="a model preset of conf/model/ (debug: the CPU check)")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the preset's)")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1, help="micro batch (training.local_batch_size)")
    ap.add_argument("--global-batch", type=int, help="training.global_batch_size (gradient accumulation)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--float8", action="store_true")
    ap.add_argument("--ac", choices=["none", "selective", "full"], default="none")
    ap.add_argument("--offload", action="store_true", help="training.enable_cpu_offload (FSDP2: more than one GPU)")
    args = ap.parse_args()
    gbs = args.global_batch or args.batch
    if gbs % args.batch:
        ap.error(f"--global-batch {gbs}: a multiple of --batch {args.batch}")
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup: at least 1 each (TorchTitan's first step includes compilation)")

    if args.offload and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # torchtitan/train.py: with enable_cpu_offload it builds the model on the CPU and leaves the move to
        # FSDP2's fully_shard, which one process does not apply: the model would stay on the CPU
        ap.error("--offload: TorchTitan 0.2.2 offloads through FSDP2 only (more than one GPU); in one process its "
                 "model would be built and left on the CPU. Drop --offload, or launch several processes "
                 "(torchrun) with FSDP")
    import torch

    gpu = torch.cuda.is_available()
    if args.compile and args.float8 and not gpu:
        ap.error("--float8 on a CPU emulates the fp8 GEMMs, which TorchTitan does not allow under --compile")
    cfg = compose(args.shape, args.layers, args.seq)
    from primus.backends.torchtitan.flavors import build_flavor

    fl = build_flavor(cfg)
    if fl.issues:
        sys.exit(f"--shape {args.shape}: TorchTitan 0.2.2 cannot build it: " + "; ".join(str(i) for i in fl.issues))
    family = FAMILY[fl.spec]
    if not gpu:
        from primus.backends.torchtitan import patches

        patches.apply("cpu")
    import importlib

    from torchtitan.protocols import train_spec as ts

    from primus.backends.torchtitan import data
    from primus.backends.torchtitan.spec import _construct

    fam = importlib.import_module(f"torchtitan.models.{family}")
    stock = fam.get_train_spec()
    args_cls = type(next(iter(stock.model_args.values())))
    flavor_args = dict(fl.args)
    flavor_args.pop("tie_word_embeddings", None)  # the project's llama3 subclass field; stock llama3 never ties
    if flavor_args.get("moe_args"):
        # TorchTitan's MoEArgs defaults for what is not the model's shape: its grouped GEMM (torch._grouped_mm, a
        # GPU kernel: the CPU check loops over experts) and its aux-loss-free balancing bias
        flavor_args["moe_args"] = dict(flavor_args["moe_args"], use_grouped_mm=gpu, load_balance_coeff=1e-3)
    if cfg.model.tie_word_embeddings and family == "llama3":
        sys.exit(f"--shape {args.shape}: tied embeddings; stock TorchTitan llama3 cannot tie them")
    stock.model_args[FLAVOR] = _construct(args_cls, flavor_args)
    # the stock spec object, with the data swapped for the synthetic stream (no download on the GPU machine)
    stock.build_dataloader_fn, stock.build_tokenizer_fn = data.build_dataloader, data.build_tokenizer
    ts.register_train_spec(family, stock)  # a registered spec wins over the family module's own

    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "0")  # the store binds any free port itself: no probe to race with
    os.makedirs(os.path.join(ROOT, "outputs", "bench"), exist_ok=True)
    out_dir = tempfile.mkdtemp(prefix="torchtitan_stock_", dir=os.path.join(ROOT, "outputs", "bench"))
    path = os.path.join(out_dir, "job.toml")
    with open(path, "w") as f:
        f.write(toml_text(job_sections(args, family, out_dir, gpu)))
    rec = TpsRecords()
    from torchtitan.components.metrics import DeviceMemoryMonitor
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    if gpu:
        torch.cuda.reset_peak_memory_stats()
    peak = run_peak(DeviceMemoryMonitor, torch.cuda.max_memory_allocated if gpu else lambda: 0)
    # torchtitan.train.main's body: its ConfigManager binds sys.argv when imported, so the toml is passed here
    init_logger()
    logging.getLogger().addHandler(rec)
    trainer = Trainer(ConfigManager().parse_args(["--job.config_file", path]))
    try:
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    from primus.metrics.flops import flops_per_token
    from primus.metrics.peaks import peak_tflops

    timed = sorted(t for step, _, t in rec.steps if step > args.warmup)
    if not timed:
        sys.exit(f"no timed step in TorchTitan's log (steps seen: {[s for s, _, _ in rec.steps]})")
    tps = timed[len(timed) // 2]
    m = cfg.model
    tflops = tps * flops_per_token(m, args.seq) / 1e12
    peaks = peak_tflops(torch.cuda.get_device_name(0) if gpu else None)
    loss = rec.steps[-1][1]
    print(json.dumps({
        "name": "torchtitan-stock" + ("/compile" if args.compile else "") + ("/float8" if args.float8 else "")
                + (f"/ac-{args.ac}" if args.ac != "none" else ""),
        "shape": args.shape, "layers": m.num_layers, "family": family, "micro_batch": args.batch,
        "global_batch": gbs, "seq": args.seq, "device": "cuda" if gpu else "cpu",
        "offload": "FSDP2 CPU offload" if args.offload else "off",
        "toml": path, "tokens_per_s": tps, "tflops_per_gpu": tflops,
        "mfu": tflops / peaks[0] if peaks else None,
        "mfu_causal": tps * flops_per_token(m, args.seq, causal=True) / 1e12 / peaks[0] if peaks else None,
        "mfu_fp8_peak": tflops / peaks[1] if peaks else None,
        "peak_memory_gib": peak() / 2**30 if gpu else None,
        "step_time_s": gbs * args.seq / tps, "loss": loss, "finite": math.isfinite(loss)}))


if __name__ == "__main__":
    main()
