"""The portable fp8 path (no Transformer Engine) wires megatron's parallel linears correctly.

The fp8 GEMM itself is primus.turbo's (tested there, on GPUs). The wiring tests replace it by a plain linear that
counts its calls, so a CPU run checks which linears are converted (first/last layers kept in bf16), which entry
point serves them (the custom ops at tp=1 for a stateless recipe, the autograd.Function otherwise), and that the
tensor-parallel communication around the converted GEMMs is right (tp=2 with sequence parallel matches 1 process).
The later tests run the real fp8 kernels (Triton's interpreter), also under training.compile: no graph break.
Graph-break and loss-equality checks compile with aot_eager (dynamo and AOT autograd trace the custom ops as
inductor would be handed them); inductor itself, which compiles C++ on a CPU for minutes, runs once per custom-op
family: the fp8 linears (tensorwise, with and without the weight cache: inductor's donated buffers) and the fused
fp8 MLP.

Every configuration runs in one of two launches, one process and two ranks (`one`, `two`): an interpreter start
and the imports of torch, megatron and Triton cost more than most configurations. The interpreted kernels' work
grows with the tokens of a micro batch and the MLP's width, so the runs are 2 x 16 tokens through a debug model
whose MLP is 256 wide (the kernels' sizes, tails and tiles are test_turbo_fp8's): every property checked here is
one of the wiring, not of the sizes.
"""

import pytest

from rank_script import run_rank_configs

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    __import__("importlib").util.find_spec("triton") is None, reason="primus.turbo.fp8_linear needs triton"),
    pytest.mark.xdist_group("fp8")]  # the tests share the two launches (module fixtures): one pytest-xdist worker

# Options of a configuration (the rest are train.py overrides): the fake GEMM, the backend of its torch.compile
# calls, its number of steps (default 2)
FAKE = "--fake-gemm"
AOT_EAGER = "--compile-backend=aot_eager"
STEPS3 = "--steps=3"

SCRIPT = r'''
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
import torch._dynamo
import torch._dynamo.utils
import primus.turbo.fp8_linear as f8
import primus.turbo.fp8_ops as f8ops
from primus.backends.megatron import args as margs
margs.portable_fp8_available = lambda recipe=None: True  # a CPU has no fp8 GEMM check to pass; the kernels run
from primus.backends.megatron import fp8 as mfp8
states = []
_apply = mfp8.apply
def apply(model, settings, config):  # records the delayed recipe's per-linear states
    out = _apply(model, settings, config)
    states.extend(m.primus_fp8_delayed for m in model.modules() if getattr(m, "primus_fp8_delayed", None))
    return out
mfp8.apply = apply

# the fake GEMM (--fake-gemm): a plain linear that counts its calls and records the delayed states it is handed
calls = {"n": 0, "traced": 0, "states": set(), "recipes": set()}
def plain_linear(x, weight, bias=None, recipe="tensorwise", fmt="e4m3", delayed=None):
    calls["n"] += 1
    calls["recipes"].add(recipe)
    if delayed is not None:
        assert recipe == "delayed" and isinstance(delayed, f8.DelayedLinearState)
        calls["states"].add((id(delayed), id(weight), delayed.settings.history_len, delayed.settings.margin,
                             delayed.settings.algo))
    return torch.nn.functional.linear(x, weight, bias)
def plain_traced(x, weight, bias, recipe, fmt, delayed=None):
    calls["traced"] += 1
    if delayed is not None:
        assert delayed.x.buf is not None and delayed.x.buf.device == weight.device  # allocated when built
    return plain_linear(x, weight, bias, recipe, fmt, delayed)
GEMMS = {False: (f8.fp8_linear, f8ops.fp8_linear_traced), True: (plain_linear, plain_traced)}

# weight gradients added into main_grad in their GEMM (training.gradient_accumulation_fusion), and each step's norm
import primus.turbo.cublaslt as lt
_add = lt.scaled_mm_add_
def scaled_mm_add_(*a, **kw):
    calls["accum"] += 1
    return _add(*a, **kw)
lt.scaled_mm_add_ = scaled_mm_add_
from primus.backends.megatron.trainer import MegatronTrainer
norms = []
_train_step = MegatronTrainer.train_step
def train_step(self, step):
    r = _train_step(self, step)
    norms.append(r.grad_norm)
    return r
MegatronTrainer.train_step = train_step

from primus.backends.megatron.testing import train_steps
from primus.train_loop import compile_stats
from primus.turbo.fp8_linear import WEIGHT_CASTS
_compile = torch.compile
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    torch.distributed.init_process_group("gloo")  # one group for every configuration of this launch

# several configurations, one after the other in this process (the trainer closes megatron's state); each starts
# from fresh dynamo caches and counters
for i, argv in enumerate(json.loads(sys.argv[2])):
    opts = dict(a.split("=", 1) if "=" in a else (a, "") for a in argv if a.startswith("--"))
    argv = [a for a in argv if not a.startswith("--")]
    f8.fp8_linear, f8ops.fp8_linear_traced = GEMMS["--fake-gemm" in opts]  # fp8.apply imports them per build
    backend = opts.get("--compile-backend")
    torch.compile = (lambda *a, _b=backend, **kw: _compile(*a, **{**kw, "backend": _b})) if backend else _compile
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    states.clear()
    calls.update(n=0, traced=0, states=set(), recipes=set(), accum=0)
    norms.clear()
    WEIGHT_CASTS.hits = WEIGHT_CASTS.misses = 0
    # check=False: not validate(), fp8 on CPU is (rightly) refused there
    ctx, info, losses = train_steps(argv, os.path.join(sys.argv[1], str(i)), steps=int(opts.get("--steps", 2)),
                                    check=False)
    hist = [[h.calls, h.amax_history.sum().item()] for s in states for h in (s.x, s.w, s.dy)]
    print("RESULT " + json.dumps({"config": i, "rank": ctx.rank, "losses": losses, "compile": compile_stats(),
                                  "histories": hist, "converted": info.get("fp8_linears_on_this_rank", 0),
                                  "weight_cache": info.get("fp8_weight_cache"),
                                  "fused_mlps": info.get("fp8_fused_mlps"),
                                  "weight_casts": [WEIGHT_CASTS.misses, WEIGHT_CASTS.hits],
                                  "calls": calls["n"], "traced": calls["traced"], "accum_calls": calls["accum"],
                                  "grad_norms": norms,
                                  "recipes": sorted(calls["recipes"]), "states": sorted(calls["states"])}),
          flush=True)
'''

BASE = ["device=cpu", "training.micro_batch_size=2", "training.global_batch_size=4", "training.seq_length=16",
        "model.ffn_hidden_size=256", "training.lr_warmup_iters=0"]


def launch(tmp_path, configs, nproc=1):
    """The script over {tag: options and overrides} in one launch; per tag, its ranks' results."""
    runs = run_rank_configs(tmp_path, "fp8.py", SCRIPT, [[*BASE, *c] for c in configs.values()], nproc,
                            timeout=1500)
    return dict(zip(configs, runs))


WIRING = {"plain": [], "fp8": ["precision=fp8"],
          "kept": ["precision=fp8", "precision.first_last_layers_bf16=true", "precision.num_layers_at_start_in_bf16=1",
                   "precision.num_layers_at_end_in_bf16=2"],
          "delayed": ["precision=fp8_delayed", "precision.fp8_amax_history_len=16", "precision.fp8_margin=1",
                      "precision.fp8_amax_compute_algo=most_recent"]}
TP2 = ["launcher.nproc_per_node=2", "parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"]

L2 = ["model.num_layers=2"]
COMPILE = ["training.compile=true"]
RECIPE = {r: [*L2, "precision=fp8", f"precision.fp8_recipe={r}", "precision.fp8=e4m3"]
          for r in ("tensorwise", "blockwise", "delayed")}
FUSED = [*L2, "precision=fp8", "precision.fp8=hybrid", "model.bias_activation_fusion=true"]
UNFUSED = [*FUSED, "precision.fp8_fused_mlp=false"]
GAF = "training.gradient_accumulation_fusion=true"
# the 1-process runs: the eager ones first (a compiled run leaves dynamo switched on in the process). The fp8
# linears compile with aot_eager, but tensorwise with inductor (with the weight cache and without); the fused MLP
# with aot_eager (fused and unfused) and once with inductor
ONE = {
    **{f"wiring_{tag}": [FAKE, STEPS3, *c] for tag, c in WIRING.items()},
    **RECIPE,
    "recompute_full": [*L2, "precision=fp8_delayed", "precision.fp8=e4m3", "recompute=full"],
    "cache_off": [*RECIPE["tensorwise"], "precision.fp8_weight_cache=false"],
    "fused": FUSED,
    "unfused": UNFUSED,
    "tensorwise_c": [*RECIPE["tensorwise"], *COMPILE],
    "tensorwise_c_uncached": [*RECIPE["tensorwise"], *COMPILE, "precision.fp8_weight_cache=false"],
    "blockwise_c": [*RECIPE["blockwise"], *COMPILE, AOT_EAGER],
    "delayed_c": [*RECIPE["delayed"], *COMPILE, AOT_EAGER],
    "fused_c": [*FUSED, *COMPILE, AOT_EAGER],
    "unfused_c": [*UNFUSED, *COMPILE, AOT_EAGER],
    "fused_inductor": [*FUSED, *COMPILE],
    "tensorwise_gaf": [*RECIPE["tensorwise"], GAF],
    "fused_gaf_c": [*FUSED, *COMPILE, AOT_EAGER, GAF],
}
# the 2-rank runs: the fake GEMM at tp=2 (sequence parallel), the fused MLP at tp=2, the delayed recipe under pp=2's
# 1F1B schedule
TWO = {
    "wiring_tp": [FAKE, STEPS3, "precision=fp8", *TP2],
    "fused_tp": [*FUSED, *TP2],
    "delayed_pp": [*L2, "precision=fp8_delayed", "precision.fp8=e4m3", "launcher.nproc_per_node=2",
                   "parallel.pipeline_model_parallel_size=2", "training.global_batch_size=8"],
}


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    return {tag: r[0] for tag, r in launch(tmp_path_factory.mktemp("one"), ONE).items()}


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("two"), TWO, nproc=2)


def test_portable_fp8_converts_decoder_linears_and_keeps_the_math(one):
    plain, fp8 = one["wiring_plain"], one["wiring_fp8"]
    assert plain["converted"] == 0 and plain["calls"] == 0
    assert fp8["converted"] == 4 * 4  # 4 layers x (qkv, proj, fc1, fc2); the output layer stays bf16
    assert fp8["calls"] == 16 * 3 * 2  # every converted linear, every micro batch (3 steps x 2)
    assert fp8["traced"] == fp8["calls"]  # tp=1, tensorwise: all through the custom ops (compile keeps them)
    assert fp8["losses"] == pytest.approx(plain["losses"], abs=1e-6)
    assert one["wiring_kept"]["converted"] == 4  # only layer 1 of 0..3


def test_portable_fp8_tensor_parallel_communication(one, two):
    r0, r1 = two["wiring_tp"]
    assert r0["converted"] == r1["converted"] == 16
    assert r0["traced"] == r1["traced"] == 0 and r0["calls"] > 0  # tp > 1: the autograd.Function, eagerly
    assert r0["losses"] == pytest.approx(one["wiring_fp8"]["losses"], abs=2e-3)


def test_portable_fp8_delayed_gives_each_linear_its_own_amax_histories(one):
    """precision=fp8_delayed without TE: the portable DelayedScaling, one state per converted linear (x, weight,
    dy histories), built from precision.fp8_amax_history_len / fp8_margin / fp8_amax_compute_algo."""
    r = one["wiring_delayed"]
    assert r["converted"] == 16 and r["recipes"] == ["delayed"]
    assert r["traced"] == r["calls"]  # tp=1: the delayed pair of custom ops (they declare the histories mutated)
    assert len({tuple(s[:2]) for s in r["states"]}) == 16  # 16 states, each always with its own weight
    assert len({s[0] for s in r["states"]}) == 16
    assert {tuple(s[2:]) for s in r["states"]} == {(16, 1, "most_recent")}


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "delayed"])
def test_portable_fp8_stays_inside_compiled_layers(one, recipe):
    """precision=fp8 with training.compile at tp=1: the real fp8 linears (casts and GEMMs in Triton's interpreter /
    torch._scaled_mm) are custom ops dynamo keeps inside each compiled layer, so the run has no graph break (each
    was one before); the losses are the eager fp8 run's. delayed: its amax histories, updated in place by the ops
    (declared mutated), come out of the compiled run as out of the eager one. tensorwise compiles with inductor,
    the others with aot_eager (the same ops, the same trace)."""
    eager, comp = one[recipe], one[f"{recipe}_c"]
    assert eager["converted"] == comp["converted"] == 8
    assert comp["compile"]["graph_breaks"] == 0, comp["compile"]
    assert comp["compile"]["unique_graphs"] >= 1
    assert comp["losses"] == pytest.approx(eager["losses"], abs=2e-2)
    if recipe == "tensorwise":  # two micro batches: the fp8 weight cache is on. Inductor may reuse a backward's
        # saved tensors in place (donated buffers); the cached casts it saves must come out unchanged: the same
        # compiled run without the cache gives the same losses
        off = one["tensorwise_c_uncached"]
        assert comp["weight_casts"][1] > 0 and off["weight_casts"] == [0, 0]
        assert comp["losses"] == pytest.approx(off["losses"], rel=2e-6, abs=0)
    if recipe == "delayed":  # 2 steps x 2 micro batches: 4 casts of every x and dy; the weight cast once a step
        # (two micro batches turn precision.fp8_weight_cache on), amaxes recorded
        assert [c for c, _ in comp["histories"]] == [4, 2, 4] * 8
        assert all(a > 0 for _, a in comp["histories"])
        assert [a for _, a in comp["histories"]] == pytest.approx([a for _, a in eager["histories"]], rel=0.05)


def test_fused_fp8_mlp_gives_the_unfused_losses_eager_compiled_and_tensor_parallel(one, two):
    """precision.fp8_fused_mlp (null: on here, with primus' Triton SwiGLU): each layer's MLP becomes a FusedFP8MLP,
    whose SwiGLU hands its outputs' amax to the casts. Real kernels (interpreter): the losses are the unfused run's
    (rel 2e-6: the CPU's run-to-run noise), eagerly and under training.compile (no graph break; the compiled run
    equals the compiled unfused one: both with aot_eager), and at tp=2 with sequence parallel (the linears' own
    communication around the op) they match one process as the unfused tp=2 run does. Under inductor the fused
    run has no graph break either, and gives the eager fused losses up to inductor's own rounding."""
    fused, unfused = one["fused"], one["unfused"]
    assert fused["fused_mlps"] == 2 and unfused["fused_mlps"] == 0 and fused["converted"] == 8
    assert fused["losses"] == pytest.approx(unfused["losses"], rel=2e-6, abs=0) and len(fused["losses"]) == 2
    comp, comp_u = one["fused_c"], one["unfused_c"]
    assert comp["fused_mlps"] == 2 and comp["compile"]["graph_breaks"] == 0, comp["compile"]
    assert comp["losses"] == pytest.approx(comp_u["losses"], rel=2e-6, abs=0)
    ind = one["fused_inductor"]
    assert ind["fused_mlps"] == 2 and ind["compile"]["graph_breaks"] == 0, ind["compile"]
    assert ind["losses"] == pytest.approx(fused["losses"], abs=2e-2)
    r0, r1 = two["fused_tp"]
    assert r0["fused_mlps"] == r1["fused_mlps"] == 2 and r0["losses"] == r1["losses"]
    assert r0["losses"] == pytest.approx(fused["losses"], rel=2e-2)  # tp splits the fp8 tensors' amaxes


def test_fp8_linears_add_their_weight_gradients_into_main_grad(one):
    """training.gradient_accumulation_fusion with the tensorwise fp8 linears at tp=1: each converted linear's
    weight gradient is added into its main_grad in the GEMM (primus.turbo.cublaslt.scaled_mm_add_: 8 linears x 2
    micro batches x 2 steps), eagerly and through the fused MLP under training.compile (no graph break). The
    gradient norms (of the main_grads the optimizer reads) and the losses are the unfused runs' up to the bf16
    rounding of the gradient the unfused path adds; a gradient not added, or added twice, moves the norm by tens
    of percent."""
    gaf, plain = one["tensorwise_gaf"], one["tensorwise"]
    assert gaf["converted"] == 8 and gaf["accum_calls"] == 32 and plain["accum_calls"] == 0
    assert gaf["grad_norms"] == pytest.approx(plain["grad_norms"], rel=1e-2)
    assert gaf["losses"] == pytest.approx(plain["losses"], rel=1e-3)
    comp, comp_plain = one["fused_gaf_c"], one["fused_c"]
    assert comp["fused_mlps"] == 2 and comp["accum_calls"] == 32
    assert comp["compile"]["graph_breaks"] == 0, comp["compile"]
    assert comp["grad_norms"] == pytest.approx(comp_plain["grad_norms"], rel=1e-2)
    assert comp["losses"] == pytest.approx(comp_plain["losses"], rel=1e-3)


def test_delayed_custom_ops_under_the_pipeline_schedule(two):
    """pp=2, 4 micro batches per step (1F1B: a micro batch's backward runs between later forwards): the delayed
    recipe's custom ops (real kernels, interpreter) keep the dy state on the autograd ctx, not in save_for_backward,
    so the backwards that ran in between (they bump its version) raise nothing; every x / dy history counts its 8
    casts, every weight history 2 (the weight cast once a step: the fp8 weight cache)."""
    ranks = two["delayed_pp"]
    for r in ranks:
        assert r["converted"] == 4 and len(r["losses"]) == 2  # this stage's layer: 4 linears
        assert [c for c, _ in r["histories"]] == [8, 2, 8] * 4
        assert all(a > 0 for _, a in r["histories"])
    assert ranks[0]["losses"] == ranks[1]["losses"]


def test_delayed_histories_count_each_forward_once_under_full_recompute(one):
    """recompute=full: megatron's CheckpointFunction replays every layer's forward inside the backward. The replayed
    casts record nothing, so each x / dy history counts one cast per micro batch (2 steps x 2), as without
    recompute (the code before counted 8 for x and the weight), and the weight one per step (the fp8 weight cache,
    which the replay reuses). Bit-identity of the replay: test_turbo_fp8."""
    full = one["recompute_full"]
    assert full["converted"] == 8 and len(full["losses"]) == 2
    assert [c for c, _ in full["histories"]] == [4, 2, 4] * 8
    assert all(a > 0 for _, a in full["histories"])


def test_fp8_weight_cache_keeps_the_losses_bit_for_bit(one):
    """Two micro batches per step turn the fp8 weight cache on (precision.fp8_weight_cache=null; the eager
    tensorwise run): each weight is cast by the step's first micro batch and reused by the second, and the trainer
    clears the casts around the optimizer step, so every step trains on its new weights: 8 linears x 2 steps
    casts, as many reuses. The losses are the uncached run's (bit for bit in practice; rel 2e-6 allows the 1e-6
    run-to-run noise a CPU run once showed). A cache never cleared makes 8 casts and 24 reuses, and step 2 runs
    step 1's weights."""
    on, off = one["tensorwise"], one["cache_off"]
    assert on["weight_cache"] is True and on["weight_casts"] == [16, 16]
    assert off["weight_cache"] is False and off["weight_casts"] == [0, 0]
    assert on["losses"] == pytest.approx(off["losses"], rel=2e-6, abs=0) and len(on["losses"]) == 2
