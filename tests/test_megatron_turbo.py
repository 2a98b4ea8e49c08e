"""turbo.* flags with backend=megatron (primus/backends/megatron/turbo.py): validation names the missing provider,
the swaps are counted in result.json, and training matches the non-turbo run. On CPU the Triton kernels run in
Triton's interpreter (conftest.py sets TRITON_INTERPRET=1 without a GPU), so the e2e runs are kept tiny."""
import pytest

from rank_script import point, run_points, run_rank_configs

from conftest import compose_cfg as compose
from primus.backends.megatron import args as margs
from primus.context import RunContext, gpu_present

CPU = RunContext(device="cpu", world_size=1)
HAS_TRITON = __import__("importlib").util.find_spec("triton") is not None


def issues(*overrides, ctx=CPU):
    return margs.capability_issues(compose(overrides), ctx)


# ------------------------------------------------------------------------------------------------ validation


def test_turbo_presets_are_accepted_and_reach_the_args(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert issues("turbo=megatron") == []
    assert issues("turbo=megatron_moe", "model=debug_moe") == []
    a = margs.build_args(compose(["turbo=megatron_moe", "model=debug_moe"]), CPU)
    assert a["turbo"] == {"use_turbo_attention": True, "use_turbo_rms_norm": True, "use_turbo_parallel_linear": True,
                          "use_turbo_grouped_gemm": True, "moe_use_fused_router_with_aux_score": True,
                          "use_turbo_fused_act_with_probs": True, "chunks": 2, "topk": 2}
    assert a["transformer_config"]["moe_grouped_gemm"] is True  # GroupedMLP is what the turbo GEMM serves
    assert margs.build_args(compose([]), CPU)["turbo"] == {}


def test_triton_flag_on_cpu_without_the_interpreter_names_what_is_needed(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    found = issues("turbo=megatron")
    assert any("turbo.use_turbo_rms_norm" in i.keys and "Triton kernels need a GPU" in str(i) for i in found), found
    # a planned (dry) run for a GPU it does not have skips the hardware probe
    assert issues("turbo=megatron", ctx=RunContext(device="cuda", world_size=8, planned=True)) == []


def test_deepep_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if margs._importable("deep_ep"):
        pytest.skip("deep_ep imports here")
    found = issues("model=debug_moe", "turbo=sync_free_stage2")
    assert any("turbo.use_turbo_deepep" in i.keys and "install DeepEP" in str(i) for i in found), found
    assert [i for i in issues("model=debug_moe", "turbo=sync_free_stage1") if "deep" in str(i).lower()] == []


def test_permute_fusion_without_te_is_served_by_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    found = issues("model=debug_moe", "moe.moe_permute_fusion=true")
    assert any("moe.moe_permute_fusion" in i.keys and "Triton" in str(i) for i in found), found  # CPU: needs a GPU
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert issues("model=debug_moe", "moe.moe_permute_fusion=true") == []


def test_turbo_with_the_te_spec_is_an_issue(monkeypatch):
    monkeypatch.setattr(margs, "te_available", lambda: True)
    found = issues("turbo=megatron", "backend.layer_spec=te", ctx=RunContext(device="cuda", world_size=1,
                                                                              planned=True))
    assert any("backend.layer_spec" in i.keys and "local spec" in str(i) for i in found), found


SF = ["model=debug_moe", "turbo=megatron_moe", "moe.moe_permute_fusion=true"]


@pytest.mark.parametrize("extra,missing", [
    ([], None),
    (["moe.moe_permute_fusion=false"], "moe.moe_permute_fusion"),
    (["turbo.use_turbo_grouped_gemm=false"], "turbo.use_turbo_grouped_gemm"),
    (["parallel.expert_model_parallel_size=2"], "parallel.expert_model_parallel_size"),
    (["parallel.tensor_model_parallel_size=2"], "parallel.tensor_model_parallel_size"),
    (["moe.moe_token_dispatcher_type=allgather"], "moe.moe_token_dispatcher_type"),
    (["backend.layer_spec=te"], "backend.layer_spec"),
])
def test_sync_free_dispatch_holds_exactly_where_its_preconditions_do(extra, missing):
    """features/turbo.py SYNC_FREE_DISPATCH: turbo=megatron_moe + permute fusion at ep = tp = 1 (the DeepSeek-V2-Lite
    preset's setting) runs the MoE dispatch sync-free; each missing precondition turns it off and is named, with
    what it needs, in backend_info.moe_dispatch."""
    from primus.features import turbo

    cfg = compose([*SF, *extra])
    found = turbo.sync_free_dispatch(cfg)
    info = turbo.moe_dispatch_info(cfg)
    if missing is None:
        assert found == [] and info.startswith("sync-free")
        assert turbo.turbo_args(cfg)["sync_free_dispatch"] is True
        return
    [(keys, need)] = found
    assert missing in keys and info.startswith("megatron's") and need in info, (found, info)
    assert "sync_free_dispatch" not in turbo.turbo_args(cfg)


def test_sync_free_dispatch_is_on_in_the_deepseek_preset_and_off_elsewhere():
    """On where it pays (the one-GPU DeepSeek-V2-Lite preset); off for a dense model (nothing to say), for megatron's
    own MoE code and for sync-free stage 1 (SequentialMLP experts), each with the precondition it misses."""
    from primus.features import turbo

    assert turbo.sync_free_dispatch(compose(["experiment=deepseek_v2_lite_megatron_fp8"])) == []
    assert turbo.sync_free_dispatch(compose([])) is None and turbo.moe_dispatch_info(compose([])) is None
    plain = turbo.sync_free_dispatch(compose(["model=debug_moe"]))
    assert [keys[0] for keys, _ in plain] == ["moe.moe_permute_fusion", "turbo.use_turbo_grouped_gemm"]
    stage1 = turbo.sync_free_dispatch(compose(["model=debug_moe", "turbo=sync_free_stage1"]))
    assert [keys[0] for keys, _ in stage1] == ["turbo.use_turbo_grouped_gemm"]


def test_the_moe_presets_accumulate_the_experts_weight_gradients_in_their_gemm():
    """Both one-GPU MoE presets set training.gradient_accumulation_fusion and meet every precondition of the experts'
    fused path (1.045x and 1.073x their steps without it, docs/benchmarks.md); the same preset with fp8 experts
    misses exactly that row."""
    from primus.features import training

    for preset in ("deepseek_v2_lite_megatron_fp8", "qwen3_30b_a3b_megatron_fp8"):
        assert training.experts_grad_accum_fusion(compose([f"experiment={preset}"])) == [], preset
    fp8 = training.experts_grad_accum_fusion(compose(["experiment=deepseek_v2_lite_megatron_fp8",
                                                      "turbo.grouped_gemm_fp8=true"]))
    assert [keys for keys, _ in fp8] == [("turbo.grouped_gemm_fp8",)]
    assert training.experts_grad_accum_fusion(compose(["experiment=deepseek_v2_lite_megatron_fp8",
                                                      "training.gradient_accumulation_fusion=false"])) is None


def test_the_fusion_says_which_linears_it_does_not_reach():
    """The presets' fp8 attention linears are turbo's (use_turbo_parallel_linear), which return their weight
    gradients: a note says so, naming both keys; without the turbo linears the portable fp8 linears take them, which
    accumulate in their GEMM under the tensorwise recipe (no note) and return theirs under another: the note names
    precision.fp8 and the recipe's key; in bf16 without the turbo linears, or without the fusion, no such note. A
    GroupedMLP that cannot fuse gets its own note with what it needs."""
    from primus.features import training

    def notes(overrides):
        return [i for i in training.megatron_issues(compose(overrides), None) if i.severity == "note"]

    preset = "experiment=deepseek_v2_lite_megatron_fp8"
    [n] = notes([preset])
    assert n.keys == ["training.gradient_accumulation_fusion", "turbo.use_turbo_parallel_linear"]
    assert "turbo linears" in n.rule and "megatron's own linears accumulate" in n.rule
    assert notes([preset, "turbo.use_turbo_parallel_linear=false"]) == []
    [n] = notes([preset, "turbo.use_turbo_parallel_linear=false", "precision.fp8_recipe=blockwise"])
    assert n.keys == ["training.gradient_accumulation_fusion", "precision.fp8", "precision.fp8_recipe"]
    assert "fp8 linears" in n.rule and "tensorwise" in n.rule
    assert notes([preset, "turbo.use_turbo_parallel_linear=false", "precision.fp8=null"]) == []
    dense = ["experiment=llama2_7b_megatron_fp8_gbs256", "training.gradient_accumulation_fusion=true"]
    assert notes(dense) == []
    [n] = notes(dense + ["precision.fp8_recipe=rowwise"])
    assert n.keys == ["training.gradient_accumulation_fusion", "precision.fp8", "precision.fp8_recipe"]
    assert notes([preset, "training.gradient_accumulation_fusion=false"]) == []
    [linears, experts] = notes([preset, "turbo.grouped_gemm_fp8=true"])
    assert "turbo.grouped_gemm_fp8" in experts.keys and "experts' weight gradients stay unfused" in experts.rule


def test_a_run_without_turbo_flags_runs_megatrons_own_moe_code():
    """Runs of one process (sweep points) share megatron's patched MoE entry points: a run with no turbo flag clears
    the flags an earlier turbo run left, so the patches fall through to megatron's own router and permutation."""
    import types

    from primus.backends.megatron import turbo as mturbo
    from primus.backends.megatron.trainer import MegatronTrainer

    try:
        mturbo.reset({"moe_use_fused_router_with_aux_score": True, "moe_permute_fusion": True})
        assert MegatronTrainer._turbo_setup(types.SimpleNamespace(args={"turbo": {}})) == {}
        assert mturbo._STATE["flags"] == {} and not mturbo._on("moe_use_fused_router_with_aux_score")
        # the sync-free dispatch swaps methods of a run's own dispatcher instances, never megatron's class
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as A2A

        assert all(getattr(A2A, n).__module__ == A2A.__module__
                   for n in ("preprocess", "dispatch_postprocess", "combine_preprocess"))
    finally:
        mturbo.reset({})


# ------------------------------------------------------------------------------------------------ end to end

# 64 tokens a step: the interpreter runs one Triton program per row
BASE = ["model=debug", "training.seq_length=32", "training.micro_batch_size=2", "training.global_batch_size=2",
        "training.lr=3e-3", "training.lr_warmup_iters=1", "training.timing_warmup_steps=0", "device=cpu",
        "logging.tensorboard=false"]
# the interpreted grouped GEMM runs one program step per expert, tile and K block: 4 narrow experts
MOE = ["model=debug_moe", "model.num_layers=2", "model.num_experts=4", "model.moe_ffn_hidden_size=32"]


ONLY_LINEAR = ["turbo=megatron", "turbo.use_turbo_attention=false", "turbo.use_turbo_rms_norm=false"]
TP2 = [*ONLY_LINEAR, "launcher.nproc_per_node=2", "parallel.tensor_model_parallel_size=2"]
MOE_TURBO = [*MOE, "turbo=megatron_moe", "moe.moe_permute_fusion=true", "turbo.use_turbo_rms_norm=false",
             "turbo.use_turbo_attention=false", "turbo.use_turbo_parallel_linear=false"]
POINTS = {  # name: (overrides, steps); megatron's own paths first
    "dense_plain": ([], 3),
    "moe_plain": ([*MOE, "moe.moe_grouped_gemm=true"], 2),
    "sync_free_plain": (MOE, 2),
    "dense_turbo": (["turbo=megatron"], 3),
    "linears_one": (ONLY_LINEAR, 3),
    "linears_tp2_sp": ([*TP2, "parallel.sequence_parallel=true"], 3),
    "linears_tp2": (TP2, 3),
    "moe_turbo": (MOE_TURBO, 2),
    "sync_free_stage1": ([*MOE, "turbo=sync_free_stage1"], 2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every train.py run of the end-to-end tests below, the points of one sweep (one interpreter start, one import
    of torch, megatron and Triton); those tests share one pytest-xdist worker."""
    return run_points(tmp_path_factory.mktemp("turbo"), {
        name: [f"training.train_iters={steps}", *BASE, *o] for name, (o, steps) in POINTS.items()})


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_turbo")
@pytest.mark.skipif(not HAS_TRITON, reason="turbo kernels need triton")
def test_dense_turbo_trains_like_the_plain_run(runs):
    """turbo=megatron: SDPA core via turbo_attention, Triton RMSNorm, turbo parallel linears; same losses."""
    (plain, _), (turbo, out) = point(runs, "dense_plain"), point(runs, "dense_turbo")
    info = turbo["backend_info"]
    assert info["turbo_swaps"] == {"use_turbo_attention": 4, "use_turbo_rms_norm": 4 * 2 + 1,
                                   "use_turbo_parallel_linear": 4 * 4}
    assert set(info["turbo_providers"]) == {"turbo.use_turbo_attention", "turbo.use_turbo_rms_norm",
                                            "turbo.use_turbo_parallel_linear"}
    assert "turbo: turbo.use_turbo_rms_norm -> own: triton" in out  # provider logged at start-up
    assert "turbo_autotune" not in turbo  # the CPU's interpreter runs each kernel's default: no pick to report
    assert turbo["losses"] == pytest.approx(plain["losses"], abs=2e-3)
    assert turbo["losses"][-1] < turbo["losses"][0] - 0.2


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_turbo")
@pytest.mark.skipif(not HAS_TRITON, reason="turbo kernels need triton")
@pytest.mark.parametrize("sp", ["tp2_sp", "tp2"])
def test_turbo_parallel_linear_tp2_matches_one_process(runs, sp):
    """2 gloo ranks. SP: column = chunked all-gather overlapped with GEMMs + async dgrad reduce-scatter, row =
    reduce-scatter. No SP: column = async dgrad all-reduce during the wgrad GEMM, row = chunked output all-reduce
    overlapped with the GEMM of the next chunk."""
    (one, _), (two, _) = point(runs, "linears_one"), point(runs, f"linears_{sp}")
    assert two["world_size"] == 2 and two["config"]["parallel"]["sequence_parallel"] is (sp == "tp2_sp")
    assert two["backend_info"]["turbo_swaps"]["use_turbo_parallel_linear"] == 16
    assert two["losses"] == pytest.approx(one["losses"], abs=2e-3)


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_turbo")
@pytest.mark.skipif(not HAS_TRITON, reason="turbo kernels need triton")
def test_moe_turbo_trains_like_the_plain_run(runs):
    """turbo=megatron_moe + permute fusion: Triton router (+aux scores), permute/unpermute, SwiGLU with probs and
    grouped GEMM. Two steps of a small model (the interpreted grouped GEMM is slow): the same losses as megatron's
    own code (same weights; step 2 depends on step 1's gradients)."""
    (plain, _), (turbo, out) = point(runs, "moe_plain"), point(runs, "moe_turbo")
    swaps = turbo["backend_info"]["turbo_swaps"]
    # ep = tp = 1, GroupedMLP on the turbo grouped GEMM, Triton permute: both MoE layers' dispatchers sync-free
    assert swaps == {"use_turbo_grouped_gemm": 2, "moe_use_fused_router_with_aux_score": 2,
                     "use_turbo_fused_act_with_probs": 2, "moe_permute_fusion": 2, "sync_free_dispatch": 2}, swaps
    assert turbo["backend_info"]["moe_dispatch"].startswith("sync-free")
    assert "MoE dispatch: sync-free" in out  # the start-up log
    assert turbo["losses"] == pytest.approx(plain["losses"], abs=2e-3)
    # megatron's own MoE code (GroupedMLP on megatron's gmm, its permutation): its dispatcher, with the reason
    assert "turbo_swaps" not in plain["backend_info"]
    assert "sync-free needs moe.moe_permute_fusion=true" in plain["backend_info"]["moe_dispatch"]


@pytest.mark.slow
@pytest.mark.xdist_group("megatron_turbo")
@pytest.mark.skipif(not HAS_TRITON, reason="turbo kernels need triton")
def test_sync_free_stage1_trains_like_the_plain_run(runs):
    """turbo=sync_free_stage1 (fused router + Triton permute/unpermute with a static num_out_tokens) on megatron's
    SequentialMLP experts: the same losses as megatron's own router and permutation."""
    (plain, _), (stage1, _) = point(runs, "sync_free_plain"), point(runs, "sync_free_stage1")
    info = stage1["backend_info"]
    assert info["turbo_swaps"] == {"moe_permute_fusion": 2, "moe_use_fused_router_with_aux_score": 2}
    assert info["turbo_providers"]["turbo.turbo_sync_free_moe_stage"] == "stage 1: fused router, permute fusion"
    assert stage1["losses"] == pytest.approx(plain["losses"], abs=2e-3)
    # SequentialMLP splits on host counts: megatron's dispatcher stays, and says what it would need
    assert info["moe_dispatch"].startswith("megatron's alltoall dispatcher")
    assert "sync-free needs turbo.use_turbo_grouped_gemm=true" in info["moe_dispatch"]
    assert plain["backend_info"]["moe_dispatch"].startswith("megatron's alltoall dispatcher")


# One MoE layer of a built trainer, forward + backward, on the sync-free path and then with megatron's own dispatcher
# methods back ("off"), counting what reads a tensor on the host (a device sync on a GPU) and what schedules the
# dispatcher's D2H copy. On a GPU the sync-free pass also runs under torch.cuda.set_sync_debug_mode("error").
SYNC_SCRIPT = r"""
import json, os, sys
import torch
from primus.backends.megatron.testing import compose
from primus.backends.megatron.trainer import MegatronTrainer
from primus.config.validate import validate
from primus.context import resolve
from primus.patches import apply_cpu_patches

from primus.turbo import grouped_gemm as gg

ACCUM = {"n": 0}  # backward passes of the grouped GEMMs that accumulate into main_grad
_accum_backward = gg._GroupedGemmAccum.backward


def _counted(ctx, dy):
    if not torch.compiler.is_compiling():  # counted eagerly only: a count in traced code would break the graph
        ACCUM["n"] += 1
    return _accum_backward(ctx, dy)


gg._GroupedGemmAccum.backward = staticmethod(_counted)
cfg = compose(json.loads(sys.argv[2]))
ctx = resolve(cfg, sys.argv[1])
validate(cfg, ctx)
apply_cpu_patches(ctx.device)
trainer = MegatronTrainer(cfg, ctx)
info = trainer.setup()
from megatron.core.transformer.moe import token_dispatcher as td
from megatron.core.transformer.moe.moe_layer import MoELayer

layer = next(m for m in trainer.model[0].modules() if isinstance(m, MoELayer))
d = layer.token_dispatcher
HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
seen = {"host": [], "d2h": 0, "sort_chunks": 0}


def host_read(name, fn):
    def read(*a, **k):
        f = sys._getframe(1)
        where = f.f_code.co_filename
        # Triton's CPU interpreter (and primus' patch of it) reads kernel arguments on the host; a GPU launch does not
        if os.sep + "triton" + os.sep not in where and not where.endswith("triton_interpreter.py"):
            seen["host"].append(f"{name} at {os.path.relpath(where)}:{f.f_lineno}")
        return fn(*a, **k)
    return read


def d2h(fn):
    def move(t, *a, **k):
        seen["d2h"] += torch.is_tensor(t)
        return fn(t, *a, **k)
    return move


def sort_chunks(fn):
    def sort(*a, **k):
        seen["sort_chunks"] += 1
        return fn(*a, **k)
    return sort


def fwd_bwd(strict):
    torch.manual_seed(0)
    p = next(layer.parameters())
    x = torch.randn(cfg.training.seq_length, cfg.training.micro_batch_size, cfg.model.hidden_size, dtype=p.dtype,
                    device=p.device, requires_grad=True)
    seen.update(host=[], d2h=0, sort_chunks=0)
    ACCUM["n"] = 0
    saved = {n: getattr(torch.Tensor, n) for n in HOST_READS}
    saved_td = (td.maybe_move_tensor_to_cpu, td.sort_chunks_by_idxs)
    for n, fn in saved.items():
        setattr(torch.Tensor, n, host_read(n, fn))
    td.maybe_move_tensor_to_cpu, td.sort_chunks_by_idxs = d2h(saved_td[0]), sort_chunks(saved_td[1])
    raised = None
    try:
        if strict and p.is_cuda:
            torch.cuda.set_sync_debug_mode("error")
        out, _ = layer(x)
        out.float().sum().backward()
    except RuntimeError as e:
        raised = str(e)[:300]
    finally:
        if p.is_cuda:
            torch.cuda.set_sync_debug_mode("default")
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)
        td.maybe_move_tensor_to_cpu, td.sort_chunks_by_idxs = saved_td
    res = {**seen, "sync_point": d.cuda_sync_point, "raised": raised,
           "accum_swaps": info["turbo_swaps"].get("experts_grad_accum_fusion", 0), "accum_backwards": ACCUM["n"]}
    if raised is None:
        res["out"], res["dx"] = out.float().sum().item(), x.grad.float().abs().sum().item()
    return res


# The layer under torch.compile (aot_eager: dynamo and AOT autograd, the kernels as they are), with the grouped GEMM
# traced as on sm90 (the CPU's torch._grouped_mm takes the same call), run 3 times as micro batches would: its graph
# breaks, the graphs compiled (more than one: a recompile per call, e.g. on a counter dynamo guards) and its numbers.
def compiled_fwd_bwd():
    import torch._dynamo
    from primus.backends.megatron import turbo as mturbo

    torch.manual_seed(0)
    p = next(layer.parameters())
    x = torch.randn(cfg.training.seq_length, cfg.training.micro_batch_size, cfg.model.hidden_size, dtype=p.dtype,
                    device=p.device, requires_grad=True)
    traced, mturbo._STATE["gmm_traced"] = mturbo._STATE["gmm_traced"], True
    disabled, torch._dynamo.config.disable = torch._dynamo.config.disable, False  # the CPU patches' (perf.py's undo)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        fn = torch.compile(layer, backend="aot_eager")
        for _ in range(3):
            x.grad = None
            out, _ = fn(x)
            out.float().sum().backward()
        breaks = dict(torch._dynamo.utils.counters["graph_break"])
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        mturbo._STATE["gmm_traced"], torch._dynamo.config.disable = traced, disabled
        torch._dynamo.reset()
    return {"breaks": breaks, "graphs": graphs, "out": out.float().sum().item(),
            "dx": x.grad.float().abs().sum().item()}


if next(layer.parameters()).is_cuda:
    fwd_bwd(strict=False)  # Triton's first launches compile and autotune (they synchronise); not the layer's doing
on = fwd_bwd(strict=True)
compiled = None if next(layer.parameters()).is_cuda else compiled_fwd_bwd()  # (sm90's traced GEMM faked: CPU only)
for n in ("preprocess", "dispatch_postprocess", "combine_preprocess"):  # megatron's own methods back
    delattr(d, n)
d.cuda_dtoh_point = "before_permutation_1"
off = fwd_bwd(strict=False)
moe_info = {k: v for k, v in info.items() if k in ("moe_dispatch", "turbo_swaps")}
print("RESULT " + json.dumps({"rank": 0, "info": moe_info, "on": on, "off": off, "compiled": compiled}),
      flush=True)
trainer.close()
"""
SYNC_CONFIG = [*MOE_TURBO, "model.num_layers=1", "training.seq_length=16", "training.micro_batch_size=1",
               "training.global_batch_size=1", "logging.tensorboard=false", "backend.layer_spec=local",
               "training.compile=true"]  # the compiled pass: the workarounds a compiled run applies


def sync_probe(tmp_path, device, extra=()):
    """SYNC_SCRIPT on `device`: (backend_info's MoE keys, the sync-free pass, the pass with megatron's methods)."""
    import json

    from rank_script import run_ranks

    [r] = run_ranks(tmp_path, "sync_free_probe.py", SYNC_SCRIPT,
                    [json.dumps([f"device={device}", *SYNC_CONFIG, *extra])])
    assert r["info"]["turbo_swaps"]["sync_free_dispatch"] == 1 and r["info"]["moe_dispatch"].startswith("sync-free")
    on, off = r["on"], r["off"]
    assert on["raised"] is None and on["host"] == [] and on["d2h"] == 0 and on["sort_chunks"] == 0, on
    assert on["sync_point"] == "no_sync"
    assert off["raised"] is None and off["sort_chunks"] == 2 and off["d2h"] > 0, off  # dispatch and combine
    assert off["sync_point"] != "no_sync"
    return on, off, r["compiled"]


@pytest.mark.e2e
@pytest.mark.skipif(not HAS_TRITON, reason="turbo kernels need triton")
def test_a_sync_free_moe_layer_reads_nothing_on_the_host(tmp_path):
    """A real megatron MoELayer (alltoall dispatcher, GroupedMLP on the turbo grouped GEMM, Triton router, permute and
    SwiGLU; CPU, Triton's interpreter), forward + backward: no tensor is read on the host (item / tolist / cpu /
    bool / int ...), no D2H copy is scheduled, sort_chunks is never called and the sync point stays "no_sync". With
    megatron's dispatcher methods back, the same layer reads the counts on the host (so the probe can fail) and
    gives the same numbers."""
    on, off, compiled = sync_probe(tmp_path, "cpu")
    assert any(h.startswith("tolist at ") and "moe_utils.py" in h for h in off["host"]), off["host"]
    assert (on["out"], on["dx"]) == (off["out"], off["dx"])  # the same math, to the bit
    # compiled, the whole layer is dynamo's: the router, permute and unpermute are custom ops, the grouped GEMM is
    # torch._grouped_mm (as on sm90), the aux-loss scaler is readable (workaround megatron.compile.moe_aux_loss_scale)
    assert compiled["breaks"] == {} and compiled["graphs"] == 1, compiled
    assert compiled["out"] == pytest.approx(on["out"], rel=1e-5) and compiled["dx"] == pytest.approx(on["dx"], rel=1e-5)


@pytest.mark.e2e
@pytest.mark.skipif(not HAS_TRITON, reason="turbo kernels need triton")
def test_the_experts_accumulating_their_weight_gradients_keep_the_moe_layer_sync_free_and_one_graph(tmp_path):
    """The same layer with training.gradient_accumulation_fusion: GroupedMLP runs experts_grad_accum_fusion's
    forward (the grouped GEMMs add their weight gradients into main_grad), and still reads nothing on the host and,
    compiled, is one graph with no break: the accumulation is a custom op dynamo keeps."""
    on, off, compiled = sync_probe(tmp_path, "cpu", ["training.gradient_accumulation_fusion=true"])
    assert (on["out"], on["dx"]) == (off["out"], off["dx"])
    assert on["accum_swaps"] == 1 and on["accum_backwards"] == off["accum_backwards"] == 2, on  # fc1 and fc2
    assert compiled["breaks"] == {} and compiled["graphs"] == 1, compiled
    assert compiled["out"] == pytest.approx(on["out"], rel=1e-5) and compiled["dx"] == pytest.approx(on["dx"], rel=1e-5)


@pytest.mark.e2e
@pytest.mark.skipif(not gpu_present(), reason="torch.cuda.set_sync_debug_mode needs a GPU")
def test_a_sync_free_moe_layer_runs_under_cuda_sync_debug_mode_error(tmp_path):
    """On a GPU the sync-free pass runs under torch.cuda.set_sync_debug_mode("error"): any synchronising op in the
    MoE layer's forward or backward would raise."""
    on, off, _ = sync_probe(tmp_path, "cuda")
    assert on["out"] == pytest.approx(off["out"], rel=1e-6) and on["dx"] == pytest.approx(off["dx"], rel=1e-6)


FP8_SCRIPT = r"""
import json, os, sys
import torch
import primus.turbo.fp8_linear as F8
from primus.backends.megatron import args as margs
from primus.backends.megatron import turbo as mturbo

calls = {"n": 0, "states": set()}
class St:
    def __init__(self, tensors):
        self.tensors, self.has_bias = tensors, False
def fp8_forward(x2, w, b, recipe="tensorwise", fmt="e4m3", need_wgrad=True, delayed=None):  # plain, counted
    calls["n"] += 1
    assert (recipe == "delayed") == isinstance(delayed, F8.DelayedLinearState)
    if delayed is not None:
        calls["states"].add(id(delayed))
    y = x2 @ w.t()
    return (y + b if b is not None else y), St([x2, w])
def fp8_backward(st, dy2, need_dx=True, need_dw=True, need_db=False, after_dgrad=None):
    x2, w = st.tensors
    dx = dy2 @ w if need_dx else None
    if after_dgrad is not None:
        after_dgrad(dx)
    return dx, ((dy2.t() @ x2).to(w.dtype) if need_dw else None), None
F8.fp8_forward, F8.fp8_backward = fp8_forward, fp8_backward
import primus.turbo.fp8_ops as f8ops
calls["traced"] = 0
def traced(x, w, b, recipe, fmt, delayed=None):  # the tp=1 custom-op entry point, plain and counted
    calls["n"] += 1
    calls["traced"] += 1
    assert (recipe == "delayed") == isinstance(delayed, F8.DelayedLinearState)
    if delayed is not None:
        assert delayed.x.buf is not None and delayed.x.buf.device == w.device  # allocated when built
        calls["states"].add(id(delayed))
    return torch.nn.functional.linear(x, w, b)
f8ops.fp8_linear_traced = traced
margs.portable_fp8_available = lambda recipe=None, planned=False: True  # a CPU has no fp8: pretend
mturbo.resolve = lambda cfg, ctx: {"turbo.use_turbo_parallel_linear": "test"}

from primus.backends.megatron.testing import train_steps

# several configurations, one after the other in this process (the trainer closes its groups and megatron's state)
for i, overrides in enumerate(json.loads(sys.argv[2])):
    calls.update(n=0, traced=0, states=set())
    # check=False: not validate(), fp8 on CPU is (rightly) refused there
    ctx, info, losses = train_steps(overrides, os.path.join(sys.argv[1], str(i)), steps=3, check=False)
    print("RESULT " + json.dumps({"config": i, "rank": ctx.rank, "losses": losses, "calls": calls["n"],
                                  "traced": calls["traced"], "states": len(calls["states"]),
                                  "swaps": info.get("turbo_swaps", {})}), flush=True)
"""


def run_fp8_script(tmp_path, configs, nproc=1):
    """FP8_SCRIPT over several configurations in one launch; per configuration, its ranks' results."""
    base = ["device=cpu", "training.micro_batch_size=2", "training.global_batch_size=4", "training.seq_length=64",
            "training.lr_warmup_iters=0", "turbo=megatron", "turbo.use_turbo_attention=false",
            "turbo.use_turbo_rms_norm=false"]
    return run_rank_configs(tmp_path, "turbo_fp8_wiring.py", FP8_SCRIPT, [[*base, *c] for c in configs], nproc)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="primus.turbo.fp8_linear needs triton")
def test_turbo_parallel_linear_runs_the_fp8_gemms_under_precision_fp8(tmp_path):
    """precision=fp8 + use_turbo_parallel_linear: the turbo linears call the fp8 GEMM path (replaced here by plain
    GEMMs that count calls) for the linears fp8 converts; first/last bf16 layers and tp=2+SP communication kept."""
    # the 1-process configurations in one launch, then tp=2 + SP
    (tmp_path / "one").mkdir()
    bf16, fp8, kept, delayed = (r[0] for r in run_fp8_script(tmp_path / "one", [
        [], ["precision=fp8"],
        ["precision=fp8", "precision.first_last_layers_bf16=true", "precision.num_layers_at_start_in_bf16=1",
         "precision.num_layers_at_end_in_bf16=2"],
        ["precision=fp8_delayed"]]))
    assert bf16["calls"] == 0 and bf16["swaps"]["use_turbo_parallel_linear"] == 16
    assert fp8["swaps"]["use_turbo_parallel_linear_fp8"] == 16
    assert fp8["calls"] == 16 * 3 * 2  # every linear, every micro batch (3 steps x 2)
    assert fp8["traced"] == fp8["calls"]  # tp=1, tensorwise: the fp8_ops custom ops (compiled layers keep them)
    assert fp8["losses"] == pytest.approx(bf16["losses"], abs=1e-5)
    assert kept["swaps"]["use_turbo_parallel_linear_fp8"] == 4
    (tmp_path / "two").mkdir()
    r0, r1 = run_fp8_script(tmp_path / "two", [["precision=fp8", "launcher.nproc_per_node=2",
                                                 "parallel.tensor_model_parallel_size=2",
                                                 "parallel.sequence_parallel=true"]], nproc=2)[0]
    assert r0["losses"] == pytest.approx(fp8["losses"], abs=2e-3)
    assert r0["traced"] == 0 and r0["calls"] > 0  # tp > 1: the overlapping autograd functions
    assert delayed["swaps"]["use_turbo_parallel_linear_fp8"] == 16 and delayed["states"] == 16  # one per linear
    assert delayed["traced"] == delayed["calls"]  # tp=1: the delayed pair of custom ops (histories declared)
    assert fp8["states"] == 0


def test_fp8_experts_through_the_turbo_grouped_gemm(monkeypatch):
    """turbo.grouped_gemm_fp8=true with precision=fp8 on the portable path + use_turbo_grouped_gemm: the experts'
    GEMMs run fp8 (tensorwise); without it they stay bf16 (the faster path on the H200); other recipes, first/last
    bf16 layers and a missing precondition are issues naming the keys, not a silent bf16 fallback."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gpu = RunContext(device="cuda", world_size=1)
    base = ["turbo=megatron_moe", "model=debug_moe", "precision=fp8", "turbo.grouped_gemm_fp8=true"]
    a = margs.build_args(compose(base), gpu)
    assert a["fp8_backend"] == "portable" and a["turbo"]["grouped_gemm_fp8"] == "hybrid"
    assert not [i for i in issues(*base, ctx=gpu) if "turbo.grouped_gemm_fp8" in i.keys]  # (this CPU lacks fp8)
    assert "grouped_gemm_fp8" not in margs.build_args(compose(base[:3]), gpu)["turbo"]  # opt-in
    assert "grouped_gemm_fp8" not in margs.build_args(compose(["turbo=megatron_moe", "model=debug_moe"]), gpu)["turbo"]
    found = issues(*base, "precision.fp8_recipe=rowwise", ctx=gpu)
    assert any(i.keys == ["turbo.grouped_gemm_fp8", "precision.fp8_recipe"] for i in found), found
    found = issues(*base, "precision.first_last_layers_bf16=true", ctx=gpu)
    assert any(i.keys == ["turbo.grouped_gemm_fp8", "precision.first_last_layers_bf16"] for i in found), found
    found = issues("turbo=megatron_moe", "model=debug_moe", "turbo.grouped_gemm_fp8=true", ctx=gpu)  # bf16 run
    assert any(i.keys == ["turbo.grouped_gemm_fp8"] and "precision=fp8" in i.rule for i in found), found


@pytest.mark.parametrize("ffn,warned", [(768, True), (1408, True), (4095, True), (4096, False), (14336, False)])
def test_narrow_fp8_experts_get_the_measured_warning(ffn, warned):
    """turbo.grouped_gemm_fp8 is honoured at any width; experts as narrow as those measured slower in fp8 than in
    bf16 on the H200 get a warning that says so and how to turn it off (moe_ffn_hidden_size, else ffn_hidden_size)."""
    import types

    from primus.backends.megatron import turbo as mturbo

    for tc in (types.SimpleNamespace(moe_ffn_hidden_size=ffn, ffn_hidden_size=99999),
               types.SimpleNamespace(moe_ffn_hidden_size=None, ffn_hidden_size=ffn)):
        msg = mturbo.small_experts_warning(tc)
        assert (msg is not None) is warned
        assert not warned or (f"ffn {ffn}" in msg and "turbo.grouped_gemm_fp8=false" in msg and "0.53x" in msg)


def test_fp8_experts_info_names_the_grouped_gemm(monkeypatch):
    """backend_info.fp8_experts: torch._scaled_grouped_mm for e4m3 on an sm90 GPU, the Triton kernels (with the
    reason) for hybrid, on sm100 and on the CPU; from the model's expert shapes (gated fc1: 2 x ffn)."""
    import types

    import torch

    from primus.backends.megatron import turbo as mturbo

    tc = types.SimpleNamespace(hidden_size=4096, moe_ffn_hidden_size=1408, ffn_hidden_size=None,
                               gated_linear_unit=True, num_moe_experts=64, expert_model_parallel_size=8)
    assert "Triton" in mturbo.fp8_experts_info(tc, "cpu", "e4m3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    cap = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cap[0])
    line = mturbo.fp8_experts_info(tc, "cuda:0", "e4m3")
    assert line.startswith("fp8 e4m3 rowwise: torch._scaled_grouped_mm"), line
    line = mturbo.fp8_experts_info(tc, "cuda:0", "hybrid")
    assert "Triton" in line and "e5m2" in line, line
    tc.moe_ffn_hidden_size = 1400  # fc2's K not a multiple of 16
    assert "[1400]" in mturbo.fp8_experts_info(tc, "cuda:0", "e4m3")
    tc.moe_ffn_hidden_size, cap[0] = 1408, (10, 0)
    assert "sm100" in mturbo.fp8_experts_info(tc, "cuda:0", "e4m3")


def test_portable_delayed_recipe_settings_are_checked():
    """precision=fp8_delayed on the portable path: fp8_interval other than 1 and an unknown amax algorithm are
    issues naming the key (the portable DelayedScaling updates at every cast); the defaults pass."""
    gpu = RunContext(device="cuda", world_size=1, planned=True)
    assert not [i for i in issues("precision=fp8_delayed", ctx=gpu) if i.keys[0].startswith("precision.fp8_")]
    found = issues("precision=fp8_delayed", "precision.fp8_interval=4", ctx=gpu)
    assert any(i.keys == ["precision.fp8_interval"] and i.value == 4 for i in found), found
    found = issues("precision=fp8_delayed", "precision.fp8_amax_compute_algo=mean", ctx=gpu)
    assert any(i.keys == ["precision.fp8_amax_compute_algo"] for i in found), found
    # the turbo parallel linear runs the portable recipes, delayed included; mxfp8 is an issue naming both keys
    assert not [i for i in issues("turbo=megatron", "precision=fp8_delayed", ctx=gpu)
                if i.keys == ["turbo.use_turbo_parallel_linear", "precision.fp8_recipe"]]
    found = issues("turbo=megatron", "precision=mxfp8", ctx=gpu)
    assert any(i.keys == ["turbo.use_turbo_parallel_linear", "precision.fp8_recipe"] and i.value == "mxfp8"
               for i in found), found


@pytest.mark.skipif(not HAS_TRITON, reason="turbo kernels need triton")
def test_gmm_entry_point_routes_fp8(monkeypatch):
    """megatron's gg.ops.gmm replacement: with grouped_gemm_fp8 in the run's flags it calls fp8_grouped_gemm."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch

    from primus.backends.megatron import turbo as mturbo
    from primus.turbo.grouped_gemm import fp8_grouped_gemm, grouped_gemm

    torch.manual_seed(0)
    x, w, sizes = torch.randn(12, 32).bfloat16(), torch.randn(2, 32, 16).bfloat16(), torch.tensor([5, 7])
    try:
        mturbo.reset({"use_turbo_grouped_gemm": True, "grouped_gemm_fp8": "hybrid"})
        torch.testing.assert_close(mturbo._gmm(x, w, sizes), fp8_grouped_gemm(x, w, sizes, fmt="hybrid"))
        assert mturbo.SWAPS == {"gmm_calls_fp8": 1, "gmm_calls_fp8_triton": 1}  # (CPU: the Triton kernels)
        mturbo.reset({"use_turbo_grouped_gemm": True})
        torch.testing.assert_close(mturbo._gmm(x, w, sizes), grouped_gemm(x, w, sizes))
        assert mturbo.SWAPS == {"gmm_calls": 1}
    finally:
        mturbo.reset({})


def test_the_bf16_grouped_gemm_stays_in_the_compiled_graph_where_torch_grouped_mm_serves_it():
    """`_gmm` under torch.compile: where apply() found torch._grouped_mm for the experts (gmm_traced: CUDA sm90 /
    sm100; faked here on the CPU, whose torch._grouped_mm takes the same call) one graph with no break, the same
    output and gradients as the eager entry; elsewhere, or with fp8 experts, the eager entry (a graph break)."""
    import torch._dynamo

    from primus.backends.megatron import turbo as mturbo

    torch.manual_seed(0)
    x = torch.randn(12, 32).bfloat16().requires_grad_()
    w = torch.randn(2, 16, 32).bfloat16().requires_grad_()  # (G, N, K): trans_b as GroupedMLP's fc2 in some specs
    sizes = torch.tensor([5, 7])

    def run(fn):
        x.grad = w.grad = None
        y = fn(x, w, sizes, True)
        y.float().square().sum().backward()
        return y.detach(), x.grad.clone(), w.grad.clone()

    try:
        mturbo.reset({"use_turbo_grouped_gemm": True})
        eager = run(mturbo._gmm)
        assert mturbo.SWAPS == {"gmm_calls": 1}
        mturbo._STATE["gmm_traced"] = True
        torch._dynamo.reset()
        traced = run(torch.compile(mturbo._gmm, backend="aot_eager", fullgraph=True))
        for a, b in zip(traced, eager):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        for flags, traced_ok in (({"use_turbo_grouped_gemm": True}, False),
                                 ({"use_turbo_grouped_gemm": True, "grouped_gemm_fp8": "e4m3"}, True)):
            mturbo.reset(flags)
            mturbo._STATE["gmm_traced"] = traced_ok
            torch._dynamo.reset()
            with pytest.raises(Exception, match="disable|graph break|Skip"):  # fullgraph: the eager entry breaks
                torch.compile(mturbo._gmm, backend="aot_eager", fullgraph=True)(x, w, sizes, True)
    finally:
        mturbo.reset({})
        torch._dynamo.reset()


def test_only_tp1_turbo_linears_are_traced_under_compile():
    """tp=1 turbo linears stay inside compiled layers (bf16: torch GEMMs; fp8: the fp8_ops custom ops, the delayed
    recipe's pair declaring its histories mutated); tp > 1 (collectives with async handles) stays out of dynamo."""
    from primus.backends.megatron import turbo as mturbo

    assert mturbo._traced(None, 1) and mturbo._traced("tensorwise", 1) and mturbo._traced("blockwise", 1)
    assert mturbo._traced("delayed", 1) and mturbo._traced("rowwise", 1)
    assert not mturbo._traced(None, 2) and not mturbo._traced("tensorwise", 2) and not mturbo._traced("delayed", 2)


def test_a_swap_that_found_nothing_names_the_users_key():
    """check_swapped's keys are args["turbo"] keys; the error names the config key the user set: moe.* and
    training.* for the swaps other groups turn on, turbo.* for the rest."""
    import types

    from primus.backends.megatron import turbo as mturbo
    from primus.backends.megatron.trainer import MegatronTrainer
    from primus.config.errors import ConfigError

    flags = {"moe_permute_fusion": True, "experts_grad_accum_fusion": True, "use_turbo_rms_norm": True}
    saved = dict(mturbo.SWAPS)
    mturbo.SWAPS.clear()
    try:
        with pytest.raises(ConfigError) as e:
            MegatronTrainer._turbo_built(types.SimpleNamespace(args={"turbo": flags}), {"turbo_providers": {}})
    finally:
        mturbo.SWAPS.clear()
        mturbo.SWAPS.update(saved)
    assert sorted(k for i in e.value.issues for k in i.keys) == [
        "moe.moe_permute_fusion", "training.gradient_accumulation_fusion", "turbo.use_turbo_rms_norm"]
