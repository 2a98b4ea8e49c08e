"""Turbo flags under backend=torchtitan: job-config wiring, validation (missing providers), the module swaps, and a
CPU end-to-end run with turbo attention against the stock run. GPU-only paths (fp8 GEMMs, async TP, cuDNN) are in
bench/torchtitan_turbo_smoke.py; the fp8 custom ops run here through Triton's interpreter."""
import json
import os
import subprocess

import pytest
import torch

pytest.importorskip("torchtitan")

from conftest import PY, ROOT, compose_cfg  # noqa: E402

from primus.backends.torchtitan import args as tt_args  # noqa: E402
from primus.backends.torchtitan.jobconfig_keys import TURBO_KEY  # noqa: E402
from primus.config.errors import ConfigError  # noqa: E402
from primus.context import RunContext  # noqa: E402

TT = ["backend=torchtitan"]


def _ctx(device="cpu", planned=False, tmp="/tmp/primus-tt-turbo", world_size=1):
    return RunContext(world_size=world_size, rank=0, local_rank=0, device=device, dist_backend="gloo", run_dir=tmp,
                      planned=planned)


def _issues(overrides, device="cpu", planned=False, world_size=1):
    return tt_args.capability_issues(compose_cfg(TT + overrides), _ctx(device, planned, world_size=world_size))


def _validate_msg(overrides, device="cpu"):
    from primus.config.validate import validate

    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(TT + overrides), _ctx(device))
    return str(e.value)


# ------------------------------------------------------------------------------------------ job config wiring


def test_attention_flag_adds_our_converter_and_settings():
    args = tt_args.build_args(compose_cfg(TT + ["turbo=torchtitan"]), _ctx())
    assert args["model"]["converters"] == ["primus_turbo.attention"]
    assert args[TURBO_KEY]["attention"] is True
    assert TURBO_KEY not in tt_args.build_args(compose_cfg(TT), _ctx())  # off: nothing added


def test_turbo_float8_replaces_torchao_converter():
    cfg = compose_cfg(TT + ["turbo=torchtitan_fp8", "precision=fp8", "training.compile=true"])
    args = tt_args.build_args(cfg, _ctx("cuda", planned=True))
    conv = args["model"]["converters"]
    assert conv == ["primus_turbo.attention", "primus_turbo.float8_linear"]
    assert "quantize.linear.float8" not in conv and "quantize" not in args
    assert args[TURBO_KEY]["float8_linear"] == {"recipe": "tensorwise", "fmt": "hybrid", "filter_fqns": ["output"]}
    assert args[TURBO_KEY]["compile"] is True
    # a planned (dry) run for the GPU skips the hardware probe: no issue on this CPU machine
    assert _issues(["turbo=torchtitan_fp8", "precision=fp8"], device="cuda", planned=True) == []


@pytest.mark.parametrize("precision,recipe,fmt", [("fp8_blockwise", "blockwise", "e4m3"),
                                                    ("fp8_rowwise", "rowwise", "e4m3"),
                                                    ("fp8_delayed", "delayed", "hybrid")])
def test_turbo_float8_runs_every_portable_recipe(precision, recipe, fmt):
    """torchao has no blockwise or delayed recipe; the turbo fp8 linear runs them (delayed: with its settings)."""
    over = ["turbo=torchtitan_fp8", f"precision={precision}"]
    if recipe == "delayed":
        over += ["precision.fp8_amax_history_len=16", "precision.fp8_margin=1",
                 "precision.fp8_amax_compute_algo=most_recent"]
    args = tt_args.build_args(compose_cfg(TT + over), _ctx("cuda", planned=True))
    want = {"recipe": recipe, "fmt": fmt, "filter_fqns": ["output"]}
    if recipe == "delayed":  # read by the turbo linear, so not "megatron-core only" here
        want["delayed"] = {"history_len": 16, "margin": 1, "algo": "most_recent"}
    assert args[TURBO_KEY]["float8_linear"] == want
    assert _issues(over, device="cuda", planned=True) == []
    # without turbo, torchao's converter: the error names the turbo linear as a way out
    msg = _validate_msg([f"precision={precision}"]) if recipe != "rowwise" else ""
    assert recipe == "rowwise" or ("precision.fp8_recipe" in msg and "turbo=torchtitan_fp8" in msg)


@pytest.mark.parametrize("override,key", [("precision.fp8_interval=2", "precision.fp8_interval"),
                                          ("precision.fp8_amax_compute_algo=mean", "precision.fp8_amax_compute_algo"),
                                          ("precision.fp8_amax_history_len=0", "precision.fp8_amax_history_len")])
def test_turbo_float8_delayed_settings_are_validated_as_on_megatron(override, key):
    issues = _issues(["turbo=torchtitan_fp8", "precision=fp8_delayed", override], device="cuda", planned=True)
    assert [list(i.keys) for i in issues] == [[key]], [str(i) for i in issues]
    assert "megatron-core only" not in str(issues[0])
    # with tensorwise the delayed settings are read by nobody: still refused as megatron-only
    issues = _issues(["turbo=torchtitan_fp8", "precision=fp8", override], device="cuda", planned=True)
    assert key in [k for i in issues for k in i.keys] and "megatron-core only" in " ".join(map(str, issues))


def test_turbo_float8_under_tensor_parallelism_is_validated():
    """The turbo fp8 linear runs under TorchTitan's TP plan (torchao's float8 TP plan is not applied by 0.2.2): a
    tp whose shards stay multiples of 16 is fine; one that does not, or async TP (it cannot fuse the fp8 custom
    ops' collectives), is an issue naming the keys."""
    tp2 = ["turbo=torchtitan_fp8", "precision=fp8", "model=llama3_2_1b", "model.tie_word_embeddings=false",
           "parallel=tp2", "parallel.sequence_parallel=true"]
    on4 = dict(device="cuda", planned=True, world_size=4)  # tp 2 x FSDP 2
    assert _issues(tp2, **on4) == []
    assert "precision.fp8" in [k for i in _issues(tp2[1:], **on4) for k in i.keys]  # torchao's float8
    bad = [str(i) for i in _issues(tp2 + ["model.ffn_hidden_size=8200"], **on4)]
    assert len(bad) == 1 and "parallel.tensor_model_parallel_size" in bad[0] and "ffn_hidden_size" in bad[0], bad
    bad = [str(i) for i in _issues(tp2 + ["training.compile=true", "overlap.enable_async_tensor_parallel=true"],
                                   **on4)]
    assert any("async TP" in b and "turbo.use_turbo_float8_linear" in b for b in bad), bad


def test_delayed_swap_without_settings_takes_delayedscalings_defaults():
    from primus.backends.torchtitan import turbo
    from primus.turbo.fp8_linear import DelayedScaling

    m = torch.nn.Sequential(torch.nn.Linear(32, 16, bias=False))
    assert turbo.swap_float8_linears(m, "delayed", filter_fqns=[]) == ["0"]
    got, want = m[0].fp8_delayed.settings, DelayedScaling()
    assert (got.history_len, got.margin, got.algo) == (want.history_len, want.margin, want.algo)
    assert turbo.swap_float8_linears(torch.nn.Sequential(torch.nn.Linear(32, 16)), "tensorwise", []) == ["0"]


def test_converter_names_match_turbo_module():
    from primus.backends.torchtitan import turbo
    from primus.features import turbo as feature

    assert (feature.TURBO_ATTENTION, feature.TURBO_FLOAT8, feature.TURBO_GROUPED_GEMM) == turbo.CONVERTERS


def test_grouped_gemm_converter_for_moe_models():
    args = tt_args.build_args(compose_cfg(TT + ["model=debug_moe", "turbo=torchtitan_moe",
                                                "moe.moe_router_load_balancing_type=none"]), _ctx())
    assert args["model"]["converters"] == ["primus_turbo.attention", "primus_turbo.grouped_gemm"]


def test_async_tp_flag_turns_on_torchtitan_async_tp():
    cfg = compose_cfg(TT + ["turbo.enable_primus_turbo=true", "turbo.use_turbo_async_tp=true", "parallel=tp2",
                            "training.compile=true"])
    args = tt_args.build_args(cfg, RunContext(world_size=2, rank=0, local_rank=0, device="cuda",
                                              dist_backend="nccl", run_dir="/tmp/x", planned=True))
    assert args["parallelism"]["enable_async_tensor_parallel"] is True


# ------------------------------------------------------------------------------------------ validation


def test_float8_flag_without_fp8_names_both_keys():
    msg = _validate_msg(["turbo=torchtitan_fp8"])
    assert "turbo.use_turbo_float8_linear" in msg and "precision.fp8" in msg


def test_float8_on_cpu_is_a_provider_error_naming_the_key():
    msg = _validate_msg(["turbo=torchtitan_fp8", "precision=fp8"])
    assert "turbo.use_turbo_float8_linear" in msg and "fp8 tensor cores" in msg
    assert "torchao" not in msg  # torchao is not what would run


def test_float8_all_gather_is_torchao_only():
    msgs = " ".join(i.rule + " ".join(i.keys) for i in _issues(
        ["turbo=torchtitan_fp8", "precision=fp8", "precision.float8_enable_fsdp_float8_all_gather=true"],
        device="cuda", planned=True))
    assert "precision.float8_enable_fsdp_float8_all_gather" in msgs and "turbo.use_turbo_float8_linear" in msgs


def test_async_tp_needs_tp_and_compile():
    keys = [k for i in _issues(["turbo.enable_primus_turbo=true", "turbo.use_turbo_async_tp=true"], "cuda", True)
            for k in i.keys]
    assert "turbo.use_turbo_async_tp" in keys and "training.compile" in keys


def test_async_tp_on_cpu_is_a_provider_error():
    msg = " ".join(i.rule for i in _issues(["turbo.enable_primus_turbo=true", "turbo.use_turbo_async_tp=true",
                                            "parallel=tp2", "training.compile=true"]))
    assert "async TP" in msg


def test_grouped_gemm_on_cpu_names_what_is_missing(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    issues = _issues(["model=debug_moe", "turbo=torchtitan_moe", "moe.moe_router_load_balancing_type=none"])
    hit = [i for i in issues if "turbo.use_turbo_grouped_gemm" in i.keys]
    assert hit and ("GPU" in hit[0].rule or "triton" in hit[0].fix), issues


def test_missing_primus_turbo_package_is_named(monkeypatch):
    from primus.turbo import providers

    if providers._importable("primus_turbo"):
        pytest.skip("primus_turbo is installed here")
    msg = " ".join(i.fix for i in _issues(["turbo=torchtitan", "turbo.provider=primus_turbo"]))
    assert "Primus-Turbo" in msg


@pytest.mark.e2e
def test_dry_run_stays_import_light():
    """Validation with turbo on must not import torch on CPU (dry runs print in well under a second)."""
    code = ("import sys; from tests.conftest import compose_cfg; from primus.backends.torchtitan import args as a;"
            "from primus.context import RunContext as R;"
            "cfg = compose_cfg(['backend=torchtitan', 'turbo=torchtitan']);"
            "a.capability_issues(cfg, R(world_size=1, rank=0, local_rank=0, device='cpu', dist_backend='gloo',"
            " run_dir='/tmp/x')); print('torch' in sys.modules)")
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("False")


# ------------------------------------------------------------------------------------------ module swaps


def _tiny_llama(n_kv_heads=2):
    import torch
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs

    torch.manual_seed(0)
    m = Transformer(TransformerModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=128,
                                         max_seq_len=32, attn_type="sdpa"))
    with torch.no_grad():
        m.init_weights()
    return m


def test_attention_swap_same_math_and_compiles():
    import copy

    import torch

    from primus.backends.torchtitan import turbo

    ref = _tiny_llama()
    m = copy.deepcopy(ref)
    assert turbo.swap_attention(m) == 2 and turbo.count_turbo_attention(m) == 2
    assert turbo.swap_attention(m) == 0  # idempotent
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper

    assert all(isinstance(layer.attention.inner_attention, ScaledDotProductAttentionWrapper)
               for layer in m.layers.values())  # still TorchTitan's type (its CP / AC code matches on it)
    tok = torch.randint(0, 128, (2, 32))
    out, want = m(tok), ref(tok)
    assert torch.allclose(out, want, atol=1e-5, rtol=1e-5)
    # TorchTitan compiles each block with fullgraph=True: the swapped core must trace
    block = torch.compile(m.layers["0"], fullgraph=True, backend="aot_eager")
    h = torch.randn(2, 32, 64, requires_grad=True)
    y = block(h, m.freqs_cis, attention_masks=None)
    y.sum().backward()
    assert torch.allclose(y, ref.layers["0"](h, ref.freqs_cis, attention_masks=None), atol=1e-5)


def test_grouped_experts_swap_matches_stock():
    import torch
    from torchtitan.models.moe.moe import GroupedExperts

    from primus.backends.torchtitan import turbo

    torch.manual_seed(0)
    g = GroupedExperts(dim=32, hidden_dim=48, num_experts=4, use_grouped_mm=False)
    for w in (g.w1, g.w2, g.w3):
        torch.nn.init.normal_(w, std=0.1)
    x = torch.randn(40, 32)
    n = torch.tensor([10, 0, 17, 13])
    want = g(x, n)  # TorchTitan's per-expert loop, fp32
    root = torch.nn.Module()
    root.experts = g
    assert turbo.swap_grouped_experts(root) == 1 and isinstance(g, turbo.TurboGroupedExperts)
    for provider in ("torch", "loop"):
        g.turbo_provider = provider
        xg = x.clone().requires_grad_(True)
        out = g(xg, n)
        out.sum().backward()
        assert out.dtype == want.dtype and (out - want).abs().max() < 2e-2  # expert GEMMs in bf16
        assert g.w1.grad is not None and torch.isfinite(xg.grad).all()
        g.zero_grad()


_FP8_SCRIPT = r"""
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from primus.backends.torchtitan import turbo
from primus.turbo.fp8_linear import FP8Linear
torch.manual_seed(0)
for recipe, fmt in [r.split(":") for r in os.environ["RECIPES"].split(",")]:
    m = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(32, 16, bias=False))
    ref = FP8Linear.from_linear(m[0], recipe, fmt)
    names = turbo.swap_float8_linears(m, recipe, filter_fqns=["1"], fmt=fmt)
    assert names == ["0"] and type(m[0]).__name__ == "TurboFP8Linear" and type(m[1]) is torch.nn.Linear, names
    x = torch.randn(2, 24, 64, requires_grad=True)
    y = m[0](x); y.square().sum().backward()
    gx, gw = x.grad.clone(), m[0].weight.grad.clone()
    x.grad = None; m[0].weight.grad = None
    y2 = ref(x); y2.square().sum().backward()
    assert torch.equal(y, y2) and torch.equal(gx, x.grad) and torch.equal(gw, m[0].weight.grad)
    x.grad = None; m[0].weight.grad = None
    yc = torch.compile(m[0], fullgraph=True, backend="aot_eager")(x)  # the custom ops trace (fake kernels)
    yc.square().sum().backward()
    assert torch.equal(yc, y2) and torch.equal(gx, x.grad)
    # TorchTitan on one GPU: fp32 params under bf16 autocast, tokens not a multiple of 16 (padded in the casts).
    # Compiled vs eager agree within the fp8 band (AOT autograd may quantise via a bf16 copy: other roundings)
    rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()
    x = torch.randn(2, 23, 64, requires_grad=True)
    outs = []
    for f in (m[0], torch.compile(m[0], fullgraph=True, backend="aot_eager")):
        x.grad = None; m[0].weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = f(x)
        assert y.dtype == torch.bfloat16 and y.shape == (2, 23, 32)
        y.float().square().sum().backward()
        outs.append((y.detach(), x.grad.clone(), m[0].weight.grad.clone()))
    assert outs[1][2].dtype == torch.float32
    assert all(rel(a, b) < 0.05 for a, b in zip(*outs)), [rel(a, b) for a, b in zip(*outs)]
# delayed: built on the meta device as TorchTitan does, states allocated after materialisation; compiled (the
# custom-op pair, fullgraph) in lockstep with FP8Linear's autograd.Function: every call bit-equal, histories too
with torch.device("meta"):
    m = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(32, 16, bias=False))
names = turbo.swap_float8_linears(m, "delayed", filter_fqns=[], fmt="e4m3",
                                  delayed={"history_len": 4, "margin": 1, "algo": "max"})
assert names == ["0", "1"] and m[0].fp8_delayed.x.buf is None
m.to_empty(device="cpu")
for lin in m:
    torch.nn.init.normal_(lin.weight, std=0.1)
assert turbo.allocate_fp8_states(m) == 2
ref = [FP8Linear.from_linear(lin, "delayed", "e4m3", lin.fp8_delayed.settings) for lin in m]


def lockstep(f, calls):  # f vs the eager linears, same inputs: gradients bit-equal at every call; the histories too
    for call in range(calls):
        x = torch.randn(2, 24, 64) * (1 + call)
        got = []
        for fn in (f, lambda t: ref[1](ref[0](t))):
            xg = x.clone().requires_grad_()
            fn(xg).square().sum().backward()
            got.append((xg.grad, m[0].weight.grad.clone(), m[1].weight.grad.clone()))
            m.zero_grad(set_to_none=True)
        assert all(torch.equal(a, b) for a, b in zip(*got)), call
    for lin, r in zip(m, ref):
        for h, hr in ((lin.fp8_delayed.x, r.fp8_delayed.x), (lin.fp8_delayed.w, r.fp8_delayed.w),
                      (lin.fp8_delayed.dy, r.fp8_delayed.dy)):
            assert h.calls == calls and torch.equal(h.buf, hr.buf), (h.calls, hr.calls)


lockstep(torch.compile(m, fullgraph=True, backend="aot_eager"), 3)
# TorchTitan's activation checkpointing inside the compiled block: a recomputed forward records nothing twice
from torch.utils.checkpoint import checkpoint
for lin in list(m) + ref:
    lin.fp8_delayed.allocate("cpu")
lockstep(torch.compile(lambda t: checkpoint(m, t, use_reentrant=False), fullgraph=True, backend="aot_eager"), 2)
print("ok")
"""


def _cpu_scaled_mm_rowwise() -> bool:
    """torch 2.13's CPU torch._scaled_mm takes row scales; 2.11's (the GPU machine's) only per-tensor ones."""
    import torch

    a = torch.zeros(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
        return True
    except RuntimeError:
        return False


@pytest.mark.e2e
def test_turbo_fp8_linear_custom_ops_match_and_compile():
    """TurboFP8Linear (custom ops) == FP8Linear (autograd.Function) bit for bit, eager and under fullgraph compile,
    every recipe (delayed: built on the meta device, its states allocated after materialisation); Triton interpreter
    on CPU, in a fresh process (TRITON_INTERPRET must precede the first triton import)."""
    recipes = "tensorwise:hybrid,blockwise:e4m3" + (",rowwise:e4m3" if _cpu_scaled_mm_rowwise() else "")
    out = subprocess.run([PY, "-c", _FP8_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=170,
                         env={**os.environ, "TRITON_INTERPRET": "1", "RECIPES": recipes})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


# ------------------------------------------------------------------------------------------ end to end (CPU)

TINY = ["device=cpu", "training.seq_length=64", "training.micro_batch_size=2", "training.global_batch_size=2",
        "training.train_iters=3", "training.lr_warmup_iters=1", "logging.tensorboard=false"]


@pytest.mark.slow
def test_turbo_attention_e2e_matches_stock_and_records_providers(tmp_path):
    from test_torchtitan_e2e import run_trainer

    run_dir = tmp_path / "turbo"
    p = subprocess.run([PY, "train.py", *TT, "turbo=torchtitan", *TINY, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "turbo: turbo.use_turbo_attention -> torch SDPA" in p.stdout + p.stderr  # the start-up provider line
    r = json.load(open(run_dir / "result.json"))
    info = r["backend_info"]
    assert info["turbo_providers"] == {"turbo.use_turbo_attention": "torch SDPA (CPU flash backend)"}
    layers = compose_cfg(TT).model.num_layers
    assert info["turbo_swaps"] == {"primus_turbo.attention": layers}  # one SDPA core per layer
    stock = run_trainer(TINY, str(tmp_path / "stock"), 3)
    assert "turbo_providers" not in stock["info"]
    for a, b in zip(r["losses"], stock["losses"]):
        assert abs(a - b) < 1e-3 * max(1.0, abs(b)), (r["losses"], stock["losses"])


# Both tensor-parallel tests run in one 2-rank launch (one start of 2 processes, one gloo group): the TP plans of
# the fp8 linear, then TorchTitan's trainer under tp=2. Each part prints its RESULT lines, tagged with "part".
_TP_SCRIPT = r'''
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from primus.backends.torchtitan import turbo

dist.init_process_group("gloo")  # one group for both parts
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
D, H = 128, 256


class FFN(torch.nn.Module):  # TorchTitan's w1 (colwise) -> w2 (rowwise), bias on the colwise one too; no
    # activation between them: a ReLU's mask would flip where fp8 rounding crosses zero, outside any fp8 band
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = torch.nn.Linear(D, H), torch.nn.Linear(H, D, bias=False)

    def forward(self, x):
        return self.w2(self.w1(x))


rel = lambda a, b: ((a.double() - b.double()).norm() / b.double().norm()).item()  # noqa: E731
out = {"part": "plans", "rank": dist.get_rank()}
for recipe in ("tensorwise", "blockwise", "delayed"):
    torch.manual_seed(0)  # the same weights and data on every rank
    m = FFN()
    x = torch.randn(2, 24, D)
    dy = torch.randn(2, 24, D)
    xr = x.double().requires_grad_()
    w1, b1, w2 = (t.detach().double().requires_grad_() for t in (m.w1.weight, m.w1.bias, m.w2.weight))
    ref = (xr @ w1.t() + b1) @ w2.t()
    ref.backward(dy.double())
    turbo.swap_float8_linears(m, recipe, filter_fqns=[], fmt="e4m3",
                              delayed={"history_len": 4, "margin": 0, "algo": "max"})
    parallelize_module(m, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    assert turbo.allocate_fp8_states(m) == (2 if recipe == "delayed" else 0)
    for name, f in (("eager", m), ("compiled", torch.compile(m, fullgraph=True, backend="aot_eager"))):
        for _ in range(2):  # delayed: the first call's own amax, then the history
            xg = x.clone().requires_grad_()
            y = f(xg)
            y.backward(dy)
            g = [m.w1.weight.grad.full_tensor(), m.w1.bias.grad.full_tensor(), m.w2.weight.grad.full_tensor()]
            m.zero_grad(set_to_none=True)
        out[f"{recipe} {name}"] = [rel(y, ref), rel(xg.grad, xr.grad), *(rel(a, b.grad) for a, b in
                                                                        zip(g, (w1, b1, w2)))]
        out[f"{recipe} {name} y"] = y.detach().flatten()[:8].tolist()
    if recipe == "delayed":
        out["delayed calls"] = [h.calls for lin in (m.w1, m.w2)
                                for h in (lin.fp8_delayed.x, lin.fp8_delayed.w, lin.fp8_delayed.dy)]
print("RESULT " + json.dumps(out), flush=True)
'''


@pytest.mark.slow
@pytest.mark.xdist_group("torchtitan_turbo_tp2")
def test_turbo_fp8_linear_under_tensor_parallel_plans(tp2_ranks):
    """TurboFP8Linear under TorchTitan's TP styles (ColwiseParallel -> RowwiseParallel, 2 ranks, gloo, real DTensor
    collectives, Triton interpreter): the fp8 linear runs on the local shards with their own scales and returns the
    DTensor each style expects. Output and every gradient within the fp8 band of float64, eager and fullgraph
    compiled, for tensorwise, blockwise and delayed; both ranks see the same output."""
    r0, r1 = tp2_ranks["plans"]
    for key, errs in r0.items():
        if key in ("part", "rank", "delayed calls") or key.endswith(" y"):
            continue
        assert all(e < 0.08 for e in errs), (key, errs)
        assert r0[key + " y"] == r1[key + " y"], key
    assert r0["delayed calls"] == [4] * 6  # 2 eager + 2 compiled calls, each operand of each linear


_TP_E2E = r'''
from primus.turbo import providers
# a CPU has no fp8 tensor cores: it stands in for one (the casts in Triton's interpreter, CPU torch._scaled_mm)
_fake = providers.DeviceInfo(kind="cuda", name="CPU standing in for an fp8 GPU", capability=(9, 0), has_triton=True,
                             triton_interpret=True)
providers.probe = providers.device_info_for = lambda device: _fake
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import test_torchtitan_e2e as E
for i, overrides in enumerate(json.loads(sys.argv[2])):  # every configuration in the group set up above
    r = E.run_trainer(overrides, f"{sys.argv[1]}/run{i}", 2)
    print("RESULT " + json.dumps({"part": "e2e", "config": i, "rank": int(os.environ.get("RANK", 0)),
                                  "losses": r["losses"], "swaps": r["info"].get("turbo_swaps"),
                                  "tp": r["info"]["parallel_dims"]["tp"]}), flush=True)
# torchrun saw a rank abort at interpreter exit ("terminate called without an active exception", exit -6) after its
# RESULT line, with the gloo group still up: close it before exiting
dist.barrier()
dist.destroy_process_group()
'''
TP2 = ["parallel=tp2", "parallel.sequence_parallel=true", "launcher.nproc_per_node=2",
       "model.tie_word_embeddings=false", "turbo.use_turbo_attention=false", "precision.bf16=false",
       "precision.mixed_precision_param=float32", "training.seq_length=64", "model.num_layers=2"]
TP2_CONFIGS = [[*TP2, "turbo=torchtitan_fp8", "precision=fp8"], TP2]  # fp8, and the same run without


@pytest.fixture(scope="module")
def tp2_ranks(tmp_path_factory):
    """The launch both tensor-parallel tests read: {"plans": [rank 0, rank 1], "e2e": [[config 0's ranks], ...]}."""
    from rank_script import run_ranks

    d = tmp_path_factory.mktemp("tp2")
    out = run_ranks(d, "tp2.py", _TP_SCRIPT + _TP_E2E, [json.dumps(TP2_CONFIGS)], nproc=2, timeout=1000,
                    expect=2 * (1 + len(TP2_CONFIGS)))
    plans = [r for r in out if r["part"] == "plans"]
    e2e = [[r for r in out if r["part"] == "e2e" and r["config"] == i] for i in range(len(TP2_CONFIGS))]
    assert [r["rank"] for r in plans] == [0, 1] and all([r["rank"] for r in c] == [0, 1] for c in e2e), out
    return {"plans": plans, "e2e": e2e}


@pytest.mark.slow
@pytest.mark.xdist_group("torchtitan_turbo_tp2")
def test_torchtitan_tp2_trains_with_the_turbo_fp8_linear(tp2_ranks):
    """TorchTitan's own trainer, tp=2 + sequence parallel over 2 CPU ranks (gloo), every decoder linear a
    TurboFP8Linear (tensorwise) inside TorchTitan's TP plan: it trains like the same run without fp8 (2 steps)."""
    fp8, fp32 = tp2_ranks["e2e"]
    layers = compose_cfg(TT + TP2).model.num_layers
    assert fp8[0]["tp"] == 2 and fp8[0]["swaps"] == {"primus_turbo.float8_linear": 7 * layers}  # q k v o w1 w2 w3
    assert fp8[0]["losses"] == fp8[1]["losses"]
    for a, b in zip(fp8[0]["losses"], fp32[0]["losses"]):
        assert abs(a - b) < 1e-2 * abs(b), (fp8[0]["losses"], fp32[0]["losses"])
