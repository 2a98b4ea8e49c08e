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


def test_low_precision_main_grad_accumulates_in_its_own_dtype():
    x, dy = _operands()
    main_grad = torch.zeros(16, 24, dtype=torch.bfloat16)
    gaf.wgrad_gemm_accum_fp16(x, dy, main_grad)
    assert main_grad.dtype == torch.bfloat16
    torch.testing.assert_close(main_grad.float(), dy.float().t() @ x.float(), rtol=2e-2, atol=5e-2)


def test_install_gives_megatron_the_functions_only_without_apex(monkeypatch):
    from megatron.core.tensor_parallel import layers

    from primus.patches.registry import Conditions

    (w,) = gaf.WORKAROUNDS
    on = {"transformer_config": {"gradient_accumulation_fusion": True}, "layer_spec": "local"}
    assert w.applies(Conditions(device="cpu", args=on))
    assert not w.applies(Conditions(device="cpu", args={**on, "layer_spec": "te"}))  # TE fuses it itself
    assert not w.applies(Conditions(device="cpu", args={"transformer_config": {}, "layer_spec": "local"}))
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", None, raising=False)
    w.fix(Conditions(device="cpu", args=on))
    assert layers._grad_accum_fusion_available and layers.fused_weight_gradient_mlp_cuda is gaf.KERNELS
    apex = object()  # an installed apex extension is left in place
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", apex)
    w.fix(Conditions(device="cpu", args=on))
    assert layers.fused_weight_gradient_mlp_cuda is apex


SCRIPT = r'''
import collections, json, sys
from primus.backends.megatron.patches import grad_accum_fusion as gaf
from primus.backends.megatron.testing import train_steps

calls = collections.Counter()
fused = gaf.KERNELS.wgrad_gemm_accum_fp32
def counting(total_input, grad_output, main_grad):
    calls[tuple(main_grad.shape)] += 1
    return fused(total_input, grad_output, main_grad)
gaf.KERNELS.wgrad_gemm_accum_fp32 = counting

ctx, info, losses = train_steps(sys.argv[2:], sys.argv[1], steps=3)
print("RESULT " + json.dumps({"rank": ctx.rank, "calls": sum(calls.values()), "shapes": len(calls),
                              "losses": losses}), flush=True)
'''

BASE = ["device=cpu", "model=debug", "training.micro_batch_size=2", "training.global_batch_size=4",
        "training.seq_length=32", "training.lr_warmup_iters=0", "backend.layer_spec=local"]


@pytest.mark.slow
def test_a_fused_run_accumulates_every_linear_in_main_grad_and_trains_like_the_unfused_one(tmp_path):
    """The debug model (4 layers, 4 linears each, the output layer) on the local spec: with the fusion every
    linear's weight gradient goes through the accumulation function (2 micro batches x 3 steps), none without it;
    the losses match the unfused run's to bf16 rounding (the fused sum skips the per-micro-batch bf16 rounding)."""
    plain = run_ranks(tmp_path, "gaf_plain.py", SCRIPT, BASE, 1)[0]
    fused = run_ranks(tmp_path, "gaf_fused.py", SCRIPT, [*BASE, "training.gradient_accumulation_fusion=true"], 1)[0]
    assert plain["calls"] == 0
    linears = 4 * 4 + 1
    assert fused["calls"] == linears * 2 * 3, fused
    assert fused["losses"] == pytest.approx(plain["losses"], abs=2e-3)
    assert fused["losses"][-1] < fused["losses"][0]
