"""perf.py: training.compile=true (torch.compile per TransformerLayer) and the fused torch AdamW, on CPU."""

import pytest

from rank_script import point, run_points
import torch

from conftest import compose_cfg as compose
from primus.backends.megatron import args as margs
from primus.backends.megatron import perf
from primus.context import RunContext

BASE = ["model=debug", "training.seq_length=128", "training.micro_batch_size=4", "training.global_batch_size=8",
        "training.lr=3e-3", "training.lr_warmup_iters=1", "training.timing_warmup_steps=0", "device=cpu",
        "logging.tensorboard=false"]

# the interpreter runs one program per token: keep the Triton runs small (64 tokens a step)
SHORT = ["training.seq_length=32", "training.micro_batch_size=2", "training.global_batch_size=2"]
PLAIN_SHORT = ["model.apply_rope_fusion=false", "model.bias_activation_fusion=false", *SHORT]  # megatron's own paths
FUSED_SHORT = ["model.apply_rope_fusion=true", "model.bias_activation_fusion=true", *SHORT]
CE = ["training.seq_length=32", "precision.bf16=false"]
TP2 = ["launcher.nproc_per_node=2", "parallel.tensor_model_parallel_size=2"]
POINTS = {  # name: (overrides, steps); the compiled runs last, after the eager ones
    "eager": ([], 4),
    # the eager run the turbo-kernel and Triton-fusion runs are compared with; a 2-step run is compared with its
    # first 2 steps, on its schedule
    "plain_short": (PLAIN_SHORT, 3),
    "fused": (FUSED_SHORT, 3),
    "ce_plain": (CE, 3),
    "ce_turbo": (["model.cross_entropy_loss_fusion=true", "model.cross_entropy_fusion_impl=turbo", *CE], 3),
    "tp2_plain": ([*PLAIN_SHORT, *TP2], 3),
    "tp2_fused": ([*FUSED_SHORT, *TP2], 3),
    "compiled": (["training.compile=true"], 4),
    "compiled_turbo": (["training.compile=true", "turbo=megatron", "training.lr_decay_iters=3", *SHORT], 2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every train.py run of the end-to-end tests below, the points of one sweep (one interpreter start, one import
    of torch, megatron and Triton; Triton's interpreter on CPU); those tests share one pytest-xdist worker."""
    return run_points(tmp_path_factory.mktemp("perf"), {
        name: [f"training.train_iters={steps}", *BASE, *o] for name, (o, steps) in POINTS.items()},
        extra_env={"TRITON_INTERPRET": "1"})


def test_compile_is_accepted_and_reaches_the_args():
    cpu = RunContext(device="cpu", world_size=1)
    assert margs.capability_issues(compose(["training.compile=true"]), cpu) == []
    a = margs.build_args(compose(["training.compile=true"]), cpu)
    assert a["compile"] is True and a["fused_adamw"] is True
    assert margs.build_args(compose(["training.optimizer=sgd"]), cpu)["fused_adamw"] is False


def test_enable_dynamo_starts_the_compile_counters_afresh():
    """A compiled run reports its own graph breaks and graphs, not those of an earlier run in the process (a sweep
    point)."""
    import torch._dynamo

    from primus.train_loop import compile_stats

    # set by enable_dynamo: put back (config.patch: monkeypatch's undo of an aliased config hides it for good)
    config = torch._dynamo.config
    saved = {k: dict(v) for k, v in torch._dynamo.utils.counters.items()}
    try:
        torch._dynamo.utils.counters["graph_break"]["an earlier run's break"] += 1
        torch._dynamo.utils.counters["stats"]["unique_graphs"] += 3
        with config.patch(disable=config.disable, recompile_limit=config.recompile_limit,
                          accumulated_recompile_limit=config.accumulated_recompile_limit):
            perf.enable_dynamo()
            assert compile_stats() == {"graph_breaks": 0, "break_reasons": [], "unique_graphs": 0}
    finally:
        torch._dynamo.utils.counters.clear()
        for k, v in saved.items():
            torch._dynamo.utils.counters[k].update(v)


def test_compiled_layers_get_room_in_dynamos_recompile_limit():
    """Past recompile_limit graphs of one code object dynamo runs it uncompiled: a compiled MoE layer gets one graph
    per layer (its router's layer_number is guarded), so the limit grows with the layers compiled, over every model
    chunk (virtual pipeline), from 64 up, and never shrinks."""
    import types

    import torch._dynamo

    config = torch._dynamo.config
    compiled = []
    chunk = lambda n: types.SimpleNamespace(decoder=types.SimpleNamespace(
        layers=[types.SimpleNamespace(compile=lambda: compiled.append(1)) for _ in range(n)]))
    with config.patch(recompile_limit=8, accumulated_recompile_limit=8):
        assert perf.compile_layers(chunk(3)) == 3 and config.recompile_limit == 64  # the floor
        compiled.clear()
        assert perf.compile_layers(chunk(61)) == 61 and len(compiled) == 61
        assert config.recompile_limit == 2 * 61 + 16 and config.cache_size_limit == 2 * 61 + 16  # (its alias)
        assert perf.compile_layers(chunk(40), before=61) == 40
        assert config.recompile_limit == 2 * 101 + 16
        perf.compile_layers(chunk(2))
        assert config.recompile_limit == 2 * 101 + 16
        assert config.accumulated_recompile_limit == 8 * (2 * 101 + 16)


def test_the_moe_aux_loss_scaler_compiles_without_a_graph_break_and_keeps_its_scale(monkeypatch):
    """Workaround megatron.compile.moe_aux_loss_scale: MoEAuxLossAutoScaler.apply inside a compiled function is one
    graph (megatron-core 0.16.1's backward breaks it), and its backward scales the aux loss's gradient by the scale
    the schedule sets, before (copy_) and after each set_loss_scale."""
    import torch._dynamo
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler as S

    from primus.backends.megatron.patches import torch_compile as tc
    from primus.patches.registry import Conditions, apply_all

    for k in ("main_loss_backward_scale", "backward", "set_loss_scale"):  # the class is megatron's: put it back
        monkeypatch.setattr(S, k, S.__dict__[k])
    monkeypatch.setattr(S, "__primus_readable__", False, raising=False)
    monkeypatch.setattr(tc._AuxLossScale, "value", None)
    S.main_loss_backward_scale = None
    (w,) = [w for w in tc.WORKAROUNDS if w.name == "megatron.compile.moe_aux_loss_scale"]
    assert "megatron.compile.moe_aux_loss_scale" in apply_all([w], Conditions(device="cpu", args={"compile": True}))

    p = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))

    def f(x):
        aux = (p * p).sum()  # d aux / d p = 2 p, times the scale
        return S.apply(x * 2.0, aux).sum()

    torch._dynamo.reset()
    saved = {k: dict(v) for k, v in torch._dynamo.utils.counters.items()}
    torch._dynamo.utils.counters.clear()
    try:
        fn = torch.compile(f, backend="aot_eager")
        x = torch.ones(3)
        fn(x).backward()  # no scale set yet: 1, megatron's default
        assert torch.equal(p.grad, 2 * p.detach())
        for scale in (0.25, 4.0):  # the first set assigns the tensor, the second copies into it (no recompile)
            S.set_loss_scale(torch.tensor(scale))
            p.grad = None
            fn(x).backward()
            assert torch.equal(p.grad, 2 * p.detach() * scale), scale
        assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0, torch._dynamo.utils.counters
    finally:
        torch._dynamo.utils.counters.clear()
        for k, v in saved.items():
            torch._dynamo.utils.counters[k].update(v)
        torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_perf")
def test_compiled_layers_train_like_eager(runs):
    """Each TransformerLayer compiled (inductor, CPU): the same losses as eager, every layer counted."""
    eager, compiled = point(runs, "eager")[0], point(runs, "compiled")[0]
    assert compiled["backend_info"]["compiled_layers"] == 4
    assert compiled["backend_info"]["compiled_loss"] is True  # tp=1: the LM loss goes through inductor too
    assert compiled["losses"] == pytest.approx(eager["losses"], abs=2e-3)
    assert compiled["compile"]["graph_breaks"] == 0, compiled["compile"]  # perf.py's one fix keeps it at 0
    assert compiled["compile"]["unique_graphs"] >= 1
    assert eager["backend_info"]["optimizer_impl"] == "torch fused AdamW"
    assert "compile" not in eager


@pytest.mark.parametrize("shape", [(7, 3, 50), (16, 2, 1000)])
def test_compiled_cross_entropy_matches_float64(shape):
    """perf._cross_entropy under torch.compile (megatron's [s, b, V] logits, [b, s] labels) against float64
    log-sum-exp minus the label's logit, loss and logits gradient; bf16 logits as the model produces them."""
    torch.manual_seed(0)
    s, b, v = shape
    logits = (torch.randn(s, b, v) * 3).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, v, (b, s))
    g = torch.randn(b, s)
    fn = torch.compile(perf._cross_entropy, dynamic=False)
    out = fn(labels, logits)
    (out * g).sum().backward()
    x = logits.detach().double().requires_grad_()
    ref = torch.logsumexp(x, -1) - x.gather(-1, labels.t().unsqueeze(-1)).squeeze(-1)  # [s, b]
    (ref.t() * g.double()).sum().backward()
    assert out.shape == (b, s) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref.t().detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.grad.double(), x.grad, rtol=2e-2, atol=2e-3)  # bf16 gradient


def test_fused_adamw_switch_matches_foreach():
    """Switching a built (not yet stepped) AdamW to fused gives the same update as its foreach default."""
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(33, 7)), torch.nn.Parameter(torch.randn(5))]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    a = torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True)
    b = torch.optim.AdamW(qs, lr=1e-2, weight_decay=0.1)

    class Wrapped:  # megatron's MixedPrecisionOptimizer keeps the torch optimizer in .optimizer
        optimizer = b

    assert perf.fused_adamw(Wrapped()) == ["AdamW"]
    assert all(g["fused"] and not g["foreach"] for g in b.param_groups)
    for _ in range(3):
        for x, y in zip(ps, qs):
            g = torch.randn_like(x)
            x.grad, y.grad = g, g.clone()
        a.step()
        b.step()
    for x, y in zip(ps, qs):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    assert perf.fused_adamw(Wrapped()) == []  # already stepped: left alone


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_perf")
@pytest.mark.skipif(__import__("importlib").util.find_spec("triton") is None, reason="turbo kernels need triton")
def test_compile_with_turbo_kernels_trains(runs):
    """compile + turbo=megatron at tp=1 in bf16: the turbo attention (SDPA), RMSNorm (custom ops) and parallel
    linears (two torch GEMMs each) all stay inside the compiled layers - no graph break; same losses as the eager
    plain run. (fp8 or tp > 1 linears run eagerly: Triton casts, TP collectives.)"""
    both, plain_short = point(runs, "compiled_turbo")[0], point(runs, "plain_short")[0]
    assert len(both["losses"]) == 2
    assert both["backend_info"]["compiled_layers"] == 4
    swaps = both["backend_info"]["turbo_swaps"]
    assert (swaps["use_turbo_parallel_linear"], swaps["use_turbo_rms_norm"], swaps["use_turbo_attention"]) == (16, 9, 4)
    assert both["compile"]["graph_breaks"] == 0, both["compile"]
    assert both["losses"] == pytest.approx(plain_short["losses"][:2], abs=2e-3)


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_perf")
@pytest.mark.skipif(__import__("importlib").util.find_spec("triton") is None, reason="the fusions are Triton kernels")
def test_triton_rope_and_swiglu_fusions_train_like_megatrons_own(runs):
    """model.apply_rope_fusion / bias_activation_fusion = true: megatron's fused_single_qkv_rope and bias_swiglu
    entry points served by primus.turbo.rope / swiglu (Triton's interpreter on CPU) give the losses of megatron's
    unfused split + RoPE and eager SwiGLU."""
    plain, fused = point(runs, "plain_short")[0], point(runs, "fused")[0]
    assert fused["backend_info"]["rope_fusion"] == "primus.turbo.rope (Triton)"
    assert fused["backend_info"]["activation_fusion"] == "primus.turbo.swiglu (Triton)"
    assert "rope_fusion" not in plain["backend_info"] and "activation_fusion" not in plain["backend_info"]
    assert fused["losses"] == pytest.approx(plain["losses"], abs=2e-3)


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_perf")
@pytest.mark.skipif(__import__("importlib").util.find_spec("triton") is None, reason="a Triton kernel")
def test_turbo_cross_entropy_trains_like_megatrons_loss(runs):
    """model.cross_entropy_fusion_impl=turbo: each post-process chunk's compute_language_model_loss is
    primus.turbo.cross_entropy (Triton's interpreter on CPU; gradient written into the logits) and megatron's own
    fusion stays off; fp32 run: the losses of megatron's vocab_parallel_cross_entropy."""
    plain, turbo = point(runs, "ce_plain")[0], point(runs, "ce_turbo")[0]
    assert turbo["backend_info"]["turbo_loss"] is True and "turbo_loss" not in plain["backend_info"]
    assert turbo["losses"] == pytest.approx(plain["losses"], abs=1e-4)
    assert turbo["losses"][-1] < turbo["losses"][0]


def test_turbo_loss_matches_megatrons_contract():
    """perf._turbo_cross_entropy: megatron's [s, b, V] logits and [b, s] labels -> [b, s] loss, the gradient written
    into the logits' storage; same values as perf._cross_entropy (eager)."""
    if __import__("importlib").util.find_spec("triton") is None:
        pytest.skip("a Triton kernel")
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter (conftest)
    torch.manual_seed(0)
    s, b, v = 6, 3, 300
    w = torch.randn(16, v, device=dev, requires_grad=True)
    h = torch.randn(s, b, 16, device=dev)
    labels = torch.randint(0, v, (b, s), device=dev)
    g = torch.randn(b, s, device=dev)
    loss = perf._turbo_cross_entropy(labels, h @ w)
    (loss * g).sum().backward()
    w2 = w.detach().clone().requires_grad_()
    ref = perf._cross_entropy(labels, h @ w2)
    (ref * g).sum().backward()
    assert loss.shape == (b, s)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, w2.grad, rtol=1e-4, atol=1e-5)


def test_fusions_route_and_restore_megatrons_entry_points():
    """configure() swaps megatron's module-level entry points and puts megatron's own back (several trainers may be
    built in one process)."""
    from megatron.core.transformer import attention, mlp

    from primus.backends.megatron import fusions

    before = (attention.HAVE_FUSED_QKV_ROPE, mlp.bias_swiglu_impl)
    fusions.configure(rope=True, swiglu=True)
    assert fusions.installed() == {"rope": True, "swiglu": True} and attention.HAVE_FUSED_QKV_ROPE is True
    x = torch.randn(3, 2, 8)
    torch.testing.assert_close(mlp.bias_swiglu_impl(x, None, False, False),
                               torch.nn.functional.silu(x[..., :4]) * x[..., 4:])
    fusions.configure(rope=False, swiglu=False)
    assert fusions.installed() == {"rope": False, "swiglu": False}
    assert (attention.HAVE_FUSED_QKV_ROPE, mlp.bias_swiglu_impl) == before


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_perf")
@pytest.mark.skipif(__import__("importlib").util.find_spec("triton") is None, reason="the fusions are Triton kernels")
def test_triton_fusions_with_tensor_parallel(runs):
    """tp=2 (2 gloo ranks): each rank's fused projection holds its share of the query groups; the fused RoPE / SwiGLU
    give the losses of megatron's own path."""
    plain, fused = point(runs, "tp2_plain")[0], point(runs, "tp2_fused")[0]
    assert plain["world_size"] == fused["world_size"] == 2
    assert fused["backend_info"]["rope_fusion"] == "primus.turbo.rope (Triton)"
    assert fused["losses"] == pytest.approx(plain["losses"], abs=2e-3)
