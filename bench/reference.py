"""The plain-PyTorch reference the framework is measured against, written the quick way on purpose.

Llama-3.2-1B shape (dim 2048, 16 layers, 32 heads / 8 KV heads, FFN 8192, vocab 128256, tied embeddings), fp32
params + bf16 autocast, AdamW, SDPA. Variants: eager | compile (per block) | compile + fused AdamW |
+ torchao float8 tensorwise (lm_head kept bf16). Prints one JSON line with tokens/s, TFLOP/s, MFU, peak memory.

The LM head and its loss (`--loss`): `compiled` (default) runs the final norm, the head and the cross-entropy inside
one torch.compile region, so inductor fuses the softmax into one pass over the bf16 logits, as a user who compiles
would write it; `eager_fp32` is the quick way (the loss on an fp32 copy of the logits, outside the compiled blocks),
which at micro batch 16 costs about 50 ms a step on an H200 and made this baseline look slower than it need be.
The default micro batch (16) is the megatron presets' (`experiment=llama3_2_1b_megatron_*`): compare like with like.

    python bench/reference.py --variant compile_fused --steps 20
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from primus.config.schema import ModelConfig  # noqa: E402
from primus.metrics.flops import flops_per_token  # noqa: E402
from primus.metrics.peaks import peak_tflops  # noqa: E402

SHAPES = {
    "llama3_2_1b": dict(dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256, theta=500000.0),
    "debug": dict(dim=128, layers=4, heads=4, kv_heads=2, ffn=384, vocab=2048, theta=10000.0),
}


def rope(seq, hd, theta, device):
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=device).float() / hd)
    f = torch.outer(torch.arange(seq, device=device).float(), inv)
    return torch.cos(f), torch.sin(f)


def apply_rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, d, h, kvh, ffn):
        super().__init__()
        self.h, self.kvh, self.hd = h, kvh, d // h
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kvh * self.hd, bias=False)
        self.wv = nn.Linear(d, kvh * self.hd, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
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
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Model(nn.Module):
    def __init__(self, dim, layers, heads, kv_heads, ffn, vocab, theta, seq):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.emb.weight  # tied
        self.theta, self.hd = theta, dim // heads

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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["eager", "compile", "compile_fused", "float8"], default="compile_fused")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--loss", choices=["compiled", "eager_fp32"], default="compiled")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3_2_1b",
                    help="debug: the project's debug model's sizes, for a check of this script on a CPU")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shape = SHAPES[args.shape]
    model = Model(**shape, seq=args.seq).to(dev)
    if args.variant == "float8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda m, fqn: fqn != "out")
    if args.variant != "eager":
        for i, blk in enumerate(model.blocks):
            model.blocks[i] = torch.compile(blk)
    loss_fn = head_loss
    if args.loss == "compiled" and args.variant != "eager":
        loss_fn = torch.compile(head_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                            fused=args.variant in ("compile_fused", "float8") and dev == "cuda")
    data = torch.randint(0, shape["vocab"], (args.batch, args.seq + 1), device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    times = []
    for step in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16):
            hidden = model(data[:, :-1])
            if args.loss == "compiled":
                loss = loss_fn(model, hidden, data[:, 1:])
        if args.loss == "eager_fp32":
            with torch.autocast(dev, dtype=torch.bfloat16):
                logits = model.out(model.norm(hidden))
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), data[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    mc = ModelConfig(name=args.shape, num_layers=shape["layers"], hidden_size=shape["dim"],
                     ffn_hidden_size=shape["ffn"], num_attention_heads=shape["heads"],
                     num_query_groups=shape["kv_heads"], vocab_size=shape["vocab"], tie_word_embeddings=True)
    tps = args.batch * args.seq / med
    tflops = tps * flops_per_token(mc, args.seq) / 1e12
    peaks = peak_tflops(torch.cuda.get_device_name(0) if dev == "cuda" else None)
    print(json.dumps({
        "name": f"reference/{args.variant}", "loss_impl": args.loss, "micro_batch": args.batch, "device": dev,
        "tokens_per_s": tps, "tflops_per_gpu": tflops,
        "mfu": tflops / peaks[0] if peaks else None,
        "mfu_causal": tps * flops_per_token(mc, args.seq, causal=True) / 1e12 / peaks[0] if peaks else None,
        "mfu_fp8_peak": tflops / peaks[1] if peaks else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None,
        "step_time_s": med, "loss": loss.item(), "finite": math.isfinite(loss.item())}))


if __name__ == "__main__":
    main()
