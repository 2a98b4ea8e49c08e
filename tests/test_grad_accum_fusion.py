"""training.gradient_accumulation_fusion on the local spec without apex (workaround megatron.local.grad_accum_fusion):
the accumulation functions against the fp32 sum, and a megatron run that uses them against one that does not."""
import pytest
import torch

from primus.backends.megatron.patches import grad_accum_fusion as gaf
from rank_script import run_ranks


def _operands(dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 24, generator=g).to(dtype)  # total_input (M, K)
    dy = torch.randn(40, 16, generator=g).to(dtype)  # grad_output (M, N)
    return x, dy


def test_fp32_accumulation_is_the_fp32_sum_of_the_bf16_products():
    """apex's contract: main_grad (N, K) += grad_output^T @ total_input, products and sums in fp32, in place."""
    x, dy = _operands()
    main_grad = torch.randn(16, 24)
    want = main_grad + dy.float().t() @ x.float()
    before = main_grad.data_ptr()
    for _ in range(2):  # two micro batches
        gaf.wgrad_gemm_accum_fp32(x, dy, main_grad)
    want = want + dy.float().t() @ x.float()
    assert main_grad.data_ptr() == before and main_grad.dtype == torch.float32
    torch.testing.assert_close(main_grad, want, rtol=1e-6, atol=1e-5)


def test_the_in_gemm_accumulation_is_checked_once_and_a_refusal_is_said(monkeypatch, caplog):
    """The CUDA check of torch.addmm(out_dtype=float32, out=main_grad), run here on the CPU, where torch has no such
    kernel: the op is refused, the run is told (warning) that the gradients are summed unfused, and the verdict is
    kept for the process."""
    import logging

    monkeypatch.setitem(gaf._STATE, "cuda", None)
    caplog.set_level(logging.WARNING, logger="primus.megatron")
    assert gaf._cuda_fused_ok(torch.device("cpu")) is False
    (msg,) = [r.getMessage() for r in caplog.records if "gradient_accumulation_fusion" in r.getMessage()]
    assert "not usable here" in msg and "unfused" in msg
    assert gaf._STATE["cuda"] is False
    gaf._cuda_fused_ok(torch.device("cpu"))
    assert len([r for r in caplog.records if "gradient_accumulation_fusion" in r.getMessage()]) == 1


def test_low_precision_main_grad_accumulates_in_its_own_dtype():
    x, dy = _operands()
    main_grad = torch.zeros(16, 24, dtype=torch.bfloat16)
    gaf.wgrad_gemm_accum_fp16(x, dy, main_grad)
    assert main_grad.dtype == torch.bfloat16
    torch.testing.assert_close(main_grad.float(), dy.float().t() @ x.float(), rtol=2e-2, atol=5e-2)


def test_install_gives_megatron_the_functions_only_without_apex(monkeypatch):
    """The workaround fills megatron's slot for apex's extension (an installed one is left in place), and without
    overlap_grad_reduce also routes its linear function through `_FusedLinear`; each run decides afresh."""
    from megatron.core.tensor_parallel import layers

    from primus.patches.registry import Conditions

    (w,) = gaf.WORKAROUNDS
    on = {"transformer_config": {"gradient_accumulation_fusion": True}, "layer_spec": "local",
          "ddp_config": {"overlap_grad_reduce": False}}
    assert w.applies(Conditions(device="cpu", args=on))
    assert not w.applies(Conditions(device="cpu", args={**on, "layer_spec": "te"}))  # TE fuses it itself
    assert not w.applies(Conditions(device="cpu", args={"transformer_config": {}, "layer_spec": "local"}))
    orig = layers.linear_with_grad_accumulation_and_async_allreduce
    monkeypatch.setattr(layers, "linear_with_grad_accumulation_and_async_allreduce", orig)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", None, raising=False)
    assert w.fix(Conditions(device="cpu", args=on)).startswith("primus fused linear")
    assert layers._grad_accum_fusion_available and layers.fused_weight_gradient_mlp_cuda is gaf.KERNELS
    assert layers.linear_with_grad_accumulation_and_async_allreduce.__primus_orig__ is orig
    overlap = {**on, "ddp_config": {"overlap_grad_reduce": True}}  # DDP's hook must see the weight gradients
    assert w.fix(Conditions(device="cpu", args=overlap)) == "megatron's linear, torch accumulation"
    assert layers.linear_with_grad_accumulation_and_async_allreduce is orig
    apex = object()  # an installed apex extension is left in place
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", apex)
    assert w.fix(Conditions(device="cpu", args=on)) == "apex"
    assert layers.fused_weight_gradient_mlp_cuda is apex and layers.linear_with_grad_accumulation_and_async_allreduce is orig


def test_the_fused_linear_matches_megatrons_and_leaves_no_weight_gradient():
    """`_FusedLinear` against megatron's unfused linear: the same output and input gradient, the weight gradient in
    main_grad (fp32 sum of two micro batches) and none on the weight; bias gradient as usual."""
    from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce as mlinear

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16, 24, dtype=torch.bfloat16))
    b = torch.nn.Parameter(torch.randn(16, dtype=torch.bfloat16))
    w.main_grad = torch.zeros(16, 24)
    ref_w, ref_b = torch.zeros(16, 24), torch.zeros(16)
    for mb in range(2):
        x = torch.randn(5, 2, 24, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(5, 2, 16, dtype=torch.bfloat16)
        y = gaf._FusedLinear.apply(x, w, b, w.main_grad)
        x2 = x.detach().clone().requires_grad_()
        w2, b2 = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
        y2 = mlinear(x2, w2, b2, False, False, False)
        torch.testing.assert_close(y, y2, rtol=0, atol=0)
        y.backward(dy)
        y2.backward(dy)
        torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=0)
        ref_w += dy.reshape(-1, 16).float().t() @ x.detach().reshape(-1, 24).float()
        ref_b += dy.reshape(-1, 16).float().sum(0)
        assert w.grad is None
    torch.testing.assert_close(w.main_grad, ref_w, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(b.grad.float(), ref_b, rtol=2e-2, atol=5e-2)


SCRIPT = r'''
import collections, json, sys
from primus.backends.megatron.patches import grad_accum_fusion as gaf
from primus.backends.megatron.testing import train_steps
from primus.train_loop import compile_stats

calls = collections.Counter()
fused = gaf.wgrad_gemm_accum_fp32
def counting(total_input, grad_output, main_grad):
    calls[tuple(main_grad.shape)] += 1
    return fused(total_input, grad_output, main_grad)
gaf.wgrad_gemm_accum_fp32 = gaf.KERNELS.wgrad_gemm_accum_fp32 = counting

ctx, info, losses = train_steps(sys.argv[2:], sys.argv[1], steps=3)
print("RESULT " + json.dumps({"rank": ctx.rank, "calls": sum(calls.values()), "losses": losses,
                              "breaks": compile_stats().get("graph_breaks")}), flush=True)
'''

BASE = ["device=cpu", "model=debug", "training.micro_batch_size=2", "training.global_batch_size=4",
        "training.seq_length=32", "training.lr_warmup_iters=0", "backend.layer_spec=local"]
FUSED = "training.gradient_accumulation_fusion=true"


def _run(tmp_path, name, overrides):
    return run_ranks(tmp_path, f"gaf_{name}.py", SCRIPT, [*BASE, *overrides], 1)[0]


@pytest.mark.slow
def test_a_fused_run_accumulates_every_linear_in_main_grad_and_trains_like_the_unfused_one(tmp_path):
    """The debug model (4 layers, 4 linears each, the output layer) on the local spec: with the fusion every
    linear's weight gradient goes through the accumulation (2 micro batches x 3 steps), none without it; the losses
    match the unfused run's to bf16 rounding (the fused sum skips the per-micro-batch bf16 rounding). Compiled, the
    fused linears stay inside the layers' graphs (no graph break) with the same losses as compiled unfused."""
    plain, fused = _run(tmp_path, "plain", []), _run(tmp_path, "fused", [FUSED])
    assert plain["calls"] == 0
    assert fused["calls"] == (4 * 4 + 1) * 2 * 3, fused
    assert fused["losses"] == pytest.approx(plain["losses"], abs=2e-3)
    assert fused["losses"][-1] < fused["losses"][0]
    compiled = _run(tmp_path, "compiled", ["training.compile=true"])
    both = _run(tmp_path, "both", ["training.compile=true", FUSED])
    assert compiled["breaks"] == 0 and both["breaks"] == 0, (compiled, both)
    assert both["calls"] == fused["calls"]
    assert both["losses"] == pytest.approx(compiled["losses"], abs=2e-3)


MOE_SCRIPT = r'''
import json, os, sys
from primus.turbo import grouped_gemm as gg

calls = {"n": 0}
backward = gg._GroupedGemmAccum.backward
def counting(ctx, dy):
    calls["n"] += 1
    return backward(ctx, dy)
gg._GroupedGemmAccum.backward = staticmethod(counting)

from primus.backends.megatron.testing import train_steps

for i, overrides in enumerate(json.loads(sys.argv[2])):
    calls["n"] = 0
    ctx, info, losses = train_steps(overrides, os.path.join(sys.argv[1], str(i)), steps=2)
    print("RESULT " + json.dumps({"config": i, "rank": ctx.rank, "losses": losses, "calls": calls["n"],
                                  "swaps": info.get("turbo_swaps", {}).get("experts_grad_accum_fusion"),
                                  "info": info.get("experts_grad_accum")}), flush=True)
'''

# the interpreted kernels run one program step per expert and tile: 4 narrow experts, 2 layers
MOE = ["device=cpu", "model=debug_moe", "model.num_layers=2", "model.num_experts=4", "model.moe_ffn_hidden_size=32",
       "turbo=megatron_moe", "moe.moe_permute_fusion=true", "training.micro_batch_size=2",
       "training.global_batch_size=4", "training.seq_length=32", "training.lr_warmup_iters=0"]


@pytest.mark.slow
def test_the_moe_experts_accumulate_their_weight_gradients_in_the_gemm_and_train_like_the_unfused_run(tmp_path):
    """debug_moe on the turbo grouped GEMM: with the fusion each GroupedMLP runs experts_grad_accum_fusion's forward
    and both grouped GEMMs add their weight gradients into main_grad (2 GEMMs x MoE layers x 2 micro batches x 2
    steps backward passes, none without it); the losses match megatron's unfused accumulation to bf16 rounding."""
    from rank_script import run_rank_configs

    [plain], [fused] = run_rank_configs(tmp_path, "gaf_moe.py", MOE_SCRIPT, [MOE, [*MOE, FUSED]])
    assert plain["calls"] == 0 and plain["swaps"] is None and plain["info"] is None
    assert fused["swaps"] == 2 and fused["info"].startswith("fused"), fused
    assert fused["calls"] == 2 * fused["swaps"] * 2 * 2, fused
    assert fused["losses"] == pytest.approx(plain["losses"], abs=2e-3)
