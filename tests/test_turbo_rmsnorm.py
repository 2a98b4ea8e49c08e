"""Fused RMSNorm (Triton) vs a float64 PyTorch reference, fwd + bwd, on CPU through Triton's interpreter."""
import pytest
import torch

from turbo_util import BAND, DEV, assert_compiles_like_eager, backward_ops, fills, relerr  # noqa: I001  (sets TRITON_INTERPRET before triton imports)
from primus.turbo.rmsnorm import TurboRMSNorm, rms_norm


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 96), (19, 130)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_fwd_bwd(shape, dtype):
    g = torch.Generator().manual_seed(hash((shape, str(dtype))) % 2**31)
    N = shape[-1]
    x = torch.randn(shape, generator=g).to(DEV, dtype).requires_grad_()
    w = (1 + 0.3 * torch.randn(N, generator=g)).to(DEV, dtype).requires_grad_()
    dy = torch.randn(shape, generator=g).to(DEV, dtype)
    y = rms_norm(x, w, 1e-5)
    y.backward(dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    yr = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * wd
    yr.backward(dy.double())
    tol = BAND[dtype]
    assert relerr(y, yr) < tol
    assert relerr(x.grad, xd.grad) < tol
    assert relerr(w.grad, wd.grad) < tol


def test_module_dropin():
    m = TurboRMSNorm(40, eps=1e-6).to(DEV)
    x = torch.randn(6, 40, device=DEV)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert relerr(m(x), ref) < 1e-5


@pytest.mark.parametrize("M,N", [(37, 96), (5, 1000), (9, 4096)])
def test_every_config_of_the_tuned_forward_is_correct(M, N):
    """On a GPU the forward autotunes over _FWD's configs (rows per program x warps); each one the pruner admits
    for N must compute the same normalisation (outputs poisoned: an unwritten row shows). The interpreter cannot
    benchmark, so this is where the configs the GPU may pick are checked."""
    import triton

    from primus.turbo import rmsnorm as R

    x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    w = (1 + 0.3 * torch.randn(N, device=DEV)).to(torch.bfloat16)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    space = R._FWD.space(BLOCK_N=triton.next_power_of_2(N))
    assert len(space) >= 2 and all(c["BLOCK_M"] * triton.next_power_of_2(N) <= 16384 for c in space)
    for cfg in space:
        y, rstd = R.rms_norm_fwd(x, w, 1e-5, config=cfg)
        assert relerr(y, ref) < BAND[torch.bfloat16], cfg
        assert relerr(rstd, torch.rsqrt(x.double().pow(2).mean(-1) + 1e-5)) < 1e-5, cfg


def test_autotune_prune_keeps_the_valid_configs_for_the_call():
    """The GPU path's pruner (triton.autotune early_config_prune) admits what `space` admits for the same call."""
    import triton

    from primus.turbo import rmsnorm as R

    configs = R._FWD._auto.configs
    for N in (96, 1000, 4096, 8192):
        bn = triton.next_power_of_2(N)
        kept = R._FWD.prune(configs, {"M": 64, "N": N, "X": torch.empty(1)}, BLOCK_N=bn)
        as_dicts = [{**c.kwargs, "num_warps": c.num_warps} for c in kept]
        assert as_dicts == R._FWD.space(BLOCK_N=bn), N


def test_tuned_launch_remembers_one_pick_per_call_key(monkeypatch):
    """After the first (autotuned) launch for a key, launches go straight to the remembered config; the key tells
    apart what triton.autotune's own key would not (constexprs outside `key`, dtypes)."""
    from primus.turbo import _common
    from primus.turbo import moe_ops as M
    from primus.turbo import rmsnorm as R

    args = (torch.empty(4, 64), None, None, None, 4, 64, 64, 64, 1e-5)
    k = R._FWD.call_key(args, {"BLOCK_N": 64})
    assert k == R._FWD.call_key(args, {"BLOCK_N": 64})
    assert k != R._FWD.call_key((torch.empty(4, 64, dtype=torch.bfloat16),) + args[1:], {"BLOCK_N": 64})
    assert k != R._FWD.call_key(args[:5] + (128,) + args[6:], {"BLOCK_N": 128})
    rargs = (torch.empty(8, 64), None, None, None, None, 8, 64, 64)
    assert M._ROUTER_FWD.call_key(rargs, {"SIGMOID": True, "BE": 64}) != \
        M._ROUTER_FWD.call_key(rargs, {"SIGMOID": False, "BE": 64})

    # a GPU-style launch with the pick already made: that config runs (not the default, not the autotuner)
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    ran = []
    orig_run = R._FWD.run
    monkeypatch.setattr(R._FWD, "run", lambda cfg, *a, **kw: (ran.append(cfg), orig_run(cfg, *a, **kw)))
    monkeypatch.setattr(R._FWD, "_auto", None)  # any use of the autotuner fails the test
    x, w = torch.randn(33, 64, device=DEV), 1 + torch.randn(64, device=DEV)
    probe_args = (x, w, x, x, 33, 64, 64, 64, 1e-5)
    monkeypatch.setitem(R._FWD.picked, R._FWD.call_key(probe_args, {"BLOCK_N": 64}), {"BLOCK_M": 4, "num_warps": 4})
    y, _ = R.rms_norm_fwd(x, w, 1e-5)
    assert ran == [{"BLOCK_M": 4, "num_warps": 4}]
    assert relerr(y, x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()) < 1e-5


def test_compiles_as_one_node_without_graph_breaks():
    """rms_norm is a torch custom op pair: fullgraph compile (a graph break would raise) equals eager, fwd + bwd."""
    x = torch.randn(3, 5, 96, device=DEV, requires_grad=True)
    w = (1 + 0.3 * torch.randn(96, device=DEV)).requires_grad_()
    assert_compiles_like_eager(lambda x, w: (rms_norm(x * 2, w, 1e-5) * x).sum(), x, w)


def test_backward_fills_no_zero_gradient_for_rstd():
    """rstd is a saved output of the op: autograd would fill a zero gradient for it (one kernel per norm per
    backward) unless the op turns that off."""
    x = torch.randn(8, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    ops = backward_ops(rms_norm(x, w).float().sum())
    assert any("rms_norm_bwd" in o for o in ops) and not fills(ops), ops
