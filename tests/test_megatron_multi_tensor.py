"""patches/optimizer.py: torch foreach kernels in place of megatron's per-tensor local fallbacks (no TE / apex): the
same values as megatron's own local implementations / float64, and a real megatron run uses them."""
import re

import pytest
import torch

from rank_script import run_train
from primus.backends.megatron.patches import optimizer as MT


def _tensors(dtype):
    torch.manual_seed(0)
    return [torch.randn(n, dtype=torch.float32).to(dtype) for n in (1, 7, 1000, 4097)] + [torch.randn(33, 65)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_l2_norm_is_the_norm_of_every_element(dtype):
    ts = _tensors(dtype)
    norm, per = MT.l2_norm(2048 * 32, None, [ts[:2], ts[2:]], False)
    ref = torch.cat([t.double().reshape(-1) for t in ts]).norm()
    assert per is None and norm.shape == (1,) and norm.dtype == torch.float32
    assert norm.item() == pytest.approx(ref.item(), rel=1e-6)


def test_scale_matches_megatrons_local_fallback():
    from megatron.core.utils import local_multi_tensor_scale

    for factor in (0.37, 1.0):
        src = _tensors(torch.float32)
        ours_dst = [torch.empty_like(t, dtype=torch.bfloat16) for t in src]
        ref_dst = [torch.empty_like(t, dtype=torch.bfloat16) for t in src]
        MT.scale(0, None, [src, ours_dst], factor)  # fp32 main params -> bf16 model params (factor 1.0)
        local_multi_tensor_scale(0, None, [src, ref_dst], factor)
        assert all(torch.equal(a, b) for a, b in zip(ours_dst, ref_dst))
    grads, ref = _tensors(torch.float32), _tensors(torch.float32)
    MT.scale(0, None, [grads, grads], 0.25)  # gradient clipping: in place
    local_multi_tensor_scale(0, None, [ref, ref], 0.25)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref))


@pytest.mark.e2e
def test_a_megatron_run_uses_them_and_clips(tmp_path):
    """clip_grad far below the gradient norm: every step clips (the scale swap) and the logged norm comes from the
    l2-norm swap; the values themselves are checked against megatron's / float64 above."""
    base = ["model=debug", "training.seq_length=64", "training.micro_batch_size=2", "training.global_batch_size=2",
            "training.lr=1e-2", "training.lr_warmup_iters=0", "training.train_iters=3", "device=cpu",
            "logging.tensorboard=false"]
    res, out = run_train(tmp_path / "clip", base + ["training.clip_grad=1e-6"])
    info = res["backend_info"]["optimizer_multi_tensor"]
    for name in ("clip_grads.l2_norm_impl", "clip_grads.multi_tensor_scale_impl", "optimizer.multi_tensor_scale_impl"):
        assert name in info
    norms = [float(x) for x in re.findall(r"grad_norm ([0-9.]+)", out)]
    assert len(norms) == 3 and all(n > 1e-3 for n in norms)  # the unclipped norm is what megatron logs
    free, _ = run_train(tmp_path / "free", base + ["training.clip_grad=0"])
    assert res["losses"][0] == pytest.approx(free["losses"][0], rel=1e-6)  # same model and data before any update
    free_norms = [float(x) for x in re.findall(r"grad_norm ([0-9.]+)", _)]
    assert norms[0] == pytest.approx(free_norms[0], rel=1e-3)  # the first step's norm: same gradients
    assert res["losses"][1:] != free["losses"][1:]  # clipping to 1e-6 changed the updates
