"""The plain-PyTorch reference the framework is measured against, written the quick way on purpose.

A Llama-style dense model at the shape of one of the project's model presets (`--shape`: conf/model/<name>.yaml,
composed through Hydra like train.py's `model=<name>`, so the sizes exist once; default llama3_2_1b), fp32 params +
bf16 autocast, AdamW, SDPA. Variants: eager | compile (per block) | compile + fused AdamW | + torchao float8
tensorwise (lm_head kept bf16). Prints one JSON line with tokens/s, TFLOP/s, MFU, peak memory and the step's split
(forward/backward vs optimizer).

At 7-8B on one GPU, as a user would fit it: `--offload` runs torchao's CPUOffloadOptimizer (fp32 params on the GPU,
a copy and the AdamW states on the host; each gradient is copied to the host as the backward finishes it and the
updated params come back on a side stream); `--global-batch` accumulates micro batches up to that batch. The
gradients go to the host at each step's last micro batch only (`HostCopyGate`; `--host-copies every` keeps
torchao's copy at every micro batch). Gradient clipping is skipped under `--offload` (the optimizer's host copy of
each gradient is taken as the backward finishes it, before a clip could scale it), and that is in the JSON line.

The LM head and its loss (`--loss`): `compiled` (default) runs the final norm, the head and the cross-entropy inside
one torch.compile region, so inductor fuses the softmax into one pass over the bf16 logits, as a user who compiles
would write it; `eager_fp32` is the quick way (the loss on an fp32 copy of the logits, outside the compiled blocks),
which at micro batch 16 costs about 50 ms a step on an H200 and made this baseline look slower than it need be.
The default micro batch (16) is the megatron presets' (`experiment=llama3_2_1b_megatron_*`): compare like with like.

    python bench/reference.py --variant compile_fused --steps 20
    python bench/reference.py --shape llama2_7b --variant float8 --batch 1 --global-batch 256 --offload --steps 2
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from primus.features.model import ModelConfig  # noqa: E402
from primus.metrics.flops import flops_per_token, head_dim  # noqa: E402
from primus.metrics.peaks import peak_tflops  # noqa: E402

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def dense_shapes():
    """The model presets this Llama-style model can take: no experts, no latent attention."""
    out = []
    for f in sorted(os.listdir(os.path.join(CONF, "model"))):
        if f.endswith(".yaml") and not f.startswith("_"):
            text = open(os.path.join(CONF, "model", f)).read()
            if "num_experts:" not in text and "multi_latent_attention: true" not in text:
                out.append(f[:-5])
    return out


def model_preset(name: str, layers: int = 0) -> ModelConfig:
    """conf/model/<name>.yaml through Hydra's compose, exactly as `train.py model=<name>` reads it (layers: that
    many decoder layers instead of the preset's, as `model.num_layers=<layers>`)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from primus.config.schema import PrimusConfig, register

    register()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        d = compose("config", overrides=[f"model={name}"] + ([f"model.num_layers={layers}"] if layers else []))
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrimusConfig), d)).model


def rope(seq, hd, theta, device):
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=device).float() / hd)
    f = torch.outer(torch.arange(seq, device=device).float(), inv)
    return torch.cos(f), torch.sin(f)


def apply_rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, d, h, kvh, ffn, hd, eps):
        super().__init__()
        self.h, self.kvh, self.hd = h, kvh, hd
        self.n1, self.n2 = nn.RMSNorm(d, eps=eps), nn.RMSNorm(d, eps=eps)
        self.wq = nn.Linear(d, h * hd, bias=False)
        self.wk = nn.Linear(d, kvh * hd, bias=False)
        self.wv = nn.Linear(d, kvh * hd, bias=False)
        self.wo = nn.Linear(h * hd, d, bias=False)
        self.w1 = nn.Linear(d, ffn, bias=False)
        self.w3 = nn.Linear(d, ffn, bias=False)
        self.w2 = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        y = self.n1(x)
        q = self.wq(y).view(b, s, self.h, self.hd)
        k = self.wk(y).view(b, s, self.kvh, self.hd)
        v = self.wv(y).view(b, s, self.kvh, self.hd)
        q, k = apply_rope(q, cos[:s, None], sin[:s, None]), apply_rope(k, cos[:s, None], sin[:s, None])
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, self.h * self.hd))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Model(nn.Module):
    def __init__(self, m: ModelConfig):
        super().__init__()
        dim, self.hd = m.hidden_size, head_dim(m)
        self.emb = nn.Embedding(m.vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size, self.hd,
                                          m.norm_epsilon) for _ in range(m.num_layers))
        self.norm = nn.RMSNorm(dim, eps=m.norm_epsilon)
        self.out = nn.Linear(dim, m.vocab_size, bias=False)
        if m.tie_word_embeddings:
            self.out.weight = self.emb.weight
        self.theta = m.rotary_base

    def forward(self, tokens):
        """The last hidden state; the head and the loss are `head_loss`."""
        cos, sin = rope(tokens.shape[1], self.hd, self.theta, tokens.device)
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return x


def head_loss(model, x, targets):
    logits = model.out(model.norm(x))
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


class HostCopyGate:
    """Lets torchao's host copies of the gradients run at the last micro batch of a step only.

    torchao 0.17.0's CPUOffloadOptimizer copies each gradient to the host from a post-accumulate-grad hook, and the
    hook fires at every backward: with gradient accumulation every micro batch copies all the fp32 gradients over
    PCIe, and the optimizer reads only the last copy. The copies run on a side stream that the optimizer step
    waits for, so the step takes the longer of the compute and the copies: at all 32 of Llama-2-7B's layers and
    micro batch 1, 27 GB a micro batch (0.49 s at 55 GB/s) against about 0.27 s of compute, the step waited on
    PCIe; at 16 layers and micro batch 2 (14 GB, 0.26 s) the two were about equal, and the gate left the step as it
    was (docs/benchmarks.md). Hooks registered inside `capture()` run only while `open` is set; the training loop
    opens it for each step's last backward, as a user who accumulates gradients would arrange.
    """

    def __init__(self):
        self.open = True

    @contextlib.contextmanager
    def capture(self):
        register = torch.Tensor.register_post_accumulate_grad_hook
        gate = self

        def gated(tensor, hook):
            return register(tensor, lambda p: hook(p) if gate.open else None)

        torch.Tensor.register_post_accumulate_grad_hook = gated
        try:
            yield self
        finally:
            torch.Tensor.register_post_accumulate_grad_hook = register


def optimizer(model, args, dev, gate=None):
    fused = args.variant in ("compile_fused", "float8") and dev == "cuda"
    if not args.offload:
        return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=fused)
    try:
        from torchao.optim import CPUOffloadOptimizer
    except ImportError as e:
        sys.exit(f"--offload: torchao's CPUOffloadOptimizer does not import ({e}); install torchao (the GPU machine's "
                 "is 0.17.0: pip install torchao==0.17.0), or drop --offload")
    if dev != "cuda":
        sys.exit("--offload: torchao's CPUOffloadOptimizer moves a GPU model's optimizer to the host, and this run has "
                 "no GPU (it asserts a cuda or xpu device); drop --offload on a CPU")
    # offload_gradients=False: the device grads must survive the post-accumulate hook, or gradient accumulation
    # would restart from zero at each micro batch
    with gate.capture() if gate is not None else contextlib.nullcontext():
        return CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, offload_gradients=False, lr=3e-4,
                                   weight_decay=0.1, fused=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["eager", "compile", "compile_fused", "float8"], default="compile_fused")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--loss", choices=["compiled", "eager_fp32"], default="compiled")
    ap.add_argument("--batch", type=int, default=16, help="micro batch")
    ap.add_argument("--global-batch", type=int, help="sequences per optimizer step, reached by gradient "
                    "accumulation (a multiple of --batch; default: --batch)")
    ap.add_argument("--offload", action="store_true", help="torchao's CPUOffloadOptimizer (GPU only)")
    ap.add_argument("--host-copies", choices=["last", "every"],
                    help="with --offload, copy the gradients to the host at the last micro batch of a step (default) "
                    "or, as torchao does unchanged, at every micro batch (HostCopyGate)")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (default: the preset's)")
    ap.add_argument("--no-compile", action="store_true", help="the variant without torch.compile: a check of this "
                    "script on a CPU, where inductor's code generation takes minutes (figures always compile)")
    shapes = dense_shapes()
    ap.add_argument("--shape", default="llama3_2_1b", help="a dense model preset of conf/model/: "
                    + ", ".join(shapes) + " (debug: for a check of this script on a CPU)")
    args = ap.parse_args()
    if args.shape not in shapes:
        ap.error(f"--shape {args.shape!r}: this reference is a dense Llama-style model; the presets it can take are "
                 f"{', '.join(shapes)}")
    gbs = args.global_batch or args.batch
    if gbs < args.batch or gbs % args.batch:
        ap.error(f"--global-batch {gbs}: a multiple of the micro batch --batch {args.batch} (e.g. "
                 f"{max(1, gbs // args.batch) * args.batch})")
    accum = gbs // args.batch
    if args.host_copies and not args.offload:
        ap.error(f"--host-copies {args.host_copies}: chooses when torchao's offload optimizer copies the gradients "
                 "to the host, and this run keeps AdamW on the GPU; add --offload, or drop --host-copies")
    host_copies = (args.host_copies or "last") if args.offload else None
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.layers < 0:
        ap.error(f"--layers {args.layers}: a number of decoder layers >= 1 (or 0: the preset's)")
    mc = model_preset(args.shape, args.layers)
    model = Model(mc).to(dev)
    if args.variant == "float8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda m, fqn: fqn != "out")
    compiled = args.variant != "eager" and not args.no_compile
    if compiled:
        for i, blk in enumerate(model.blocks):
            model.blocks[i] = torch.compile(blk)
    loss_fn = head_loss
    if args.loss == "compiled" and compiled:
        loss_fn = torch.compile(head_loss)
    gate = HostCopyGate() if host_copies == "last" else None
    opt = optimizer(model, args, dev, gate)
    data = torch.randint(0, mc.vocab_size, (accum, args.batch, args.seq + 1), device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times, opt_times = [], []
    for step in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        for i, mb in enumerate(data):
            if gate is not None:
                gate.open = i == accum - 1
            with torch.autocast(dev, dtype=torch.bfloat16):
                hidden = model(mb[:, :-1])
                if args.loss == "compiled":
                    loss = loss_fn(model, hidden, mb[:, 1:])
            if args.loss == "eager_fp32":
                with torch.autocast(dev, dtype=torch.bfloat16):
                    logits = model.out(model.norm(hidden))
                loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), mb[:, 1:].reshape(-1))
            (loss / accum).backward()
        sync()
        t1 = time.perf_counter()
        if not args.offload:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            opt_times.append(time.perf_counter() - t1)
    times.sort()
    opt_times.sort()
    med = times[len(times) // 2]
    tps = gbs * args.seq / med
    tflops = tps * flops_per_token(mc, args.seq) / 1e12
    peaks = peak_tflops(torch.cuda.get_device_name(0) if dev == "cuda" else None)
    print(json.dumps({
        "name": f"reference/{args.variant}" + ("+offload" if args.offload else "") + ("/no-compile" if args.no_compile
                                                                                      else ""), "shape": args.shape,
        "layers": mc.num_layers, "loss_impl": args.loss, "micro_batch": args.batch, "global_batch": gbs,
        "seq": args.seq, "device": dev,
        "optimizer": "torchao CPUOffloadOptimizer(AdamW)" if args.offload else "AdamW", "grad_clip": not args.offload,
        "host_copies": host_copies,
        "tokens_per_s": tps, "tflops_per_gpu": tflops,
        "mfu": tflops / peaks[0] if peaks else None,
        "mfu_causal": tps * flops_per_token(mc, args.seq, causal=True) / 1e12 / peaks[0] if peaks else None,
        "mfu_fp8_peak": tflops / peaks[1] if peaks else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None,
        "step_time_s": med, "optimizer_time_s": opt_times[len(opt_times) // 2],
        "loss": loss.item(), "finite": math.isfinite(loss.item())}))


if __name__ == "__main__":
    main()
