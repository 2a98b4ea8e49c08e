"""Turbo column/row-parallel linears: tp=1 vs float64, and tp=2 over gloo (2 CPU processes) vs the unsharded
float64 MLP, fwd + bwd, with and without sequence parallel, chunked (overlapped) collectives on."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from turbo_util import DEV, relerr  # noqa: I001
from primus.turbo.parallel_linear import TurboColumnParallelLinear, TurboRowParallelLinear


def _ref(x, w1, b1, w2, b2, dy):
    xd, w1d, b1d, w2d, b2d = (t.detach().double().requires_grad_() for t in (x, w1, b1, w2, b2))
    y = torch.relu(xd @ w1d.t() + b1d) @ w2d.t() + b2d
    y.backward(dy.double())
    return y, xd.grad, w1d.grad, b1d.grad, w2d.grad, b2d.grad


def _worker(rank, ws, path):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=ws)
    try:
        for sp in (False, True):
            _check(rank, ws, sp)
    finally:
        dist.destroy_process_group()


def _check(rank, ws, sp):
    if True:
        g = torch.Generator().manual_seed(7)
        S, B, H, F = 6, 2, 16, 24  # rows = S*B = 12 (3 chunks of 4 per rank is fine too)
        x = torch.randn(S, B, H, generator=g)
        w1, b1 = torch.randn(F, H, generator=g) / 4, torch.randn(F, generator=g)
        w2, b2 = torch.randn(H, F, generator=g) / 5, torch.randn(H, generator=g)
        dy = torch.randn(S, B, H, generator=g)
        ref = _ref(x, w1, b1, w2, b2, dy)
        col = TurboColumnParallelLinear(H, F, dist.group.WORLD, sequence_parallel=sp, chunks=3)
        row = TurboRowParallelLinear(F, H, dist.group.WORLD, sequence_parallel=sp, chunks=3)
        fl, hl = F // ws, H // ws
        with torch.no_grad():
            col.weight.copy_(w1[rank * fl:(rank + 1) * fl]); col.bias.copy_(b1[rank * fl:(rank + 1) * fl])
            row.weight.copy_(w2[:, rank * fl:(rank + 1) * fl]); row.bias.copy_(b2)
        sl = S // ws
        xin = (x[rank * sl:(rank + 1) * sl] if sp else x).clone().requires_grad_()
        y = row(torch.relu(col(xin)))
        dyl = dy[rank * sl:(rank + 1) * sl] if sp else dy
        y.backward(dyl)
        yr, dxr, dw1, db1, dw2, db2 = ref
        if sp:
            assert relerr(y, yr[rank * sl:(rank + 1) * sl]) < 1e-5
            assert relerr(xin.grad, dxr[rank * sl:(rank + 1) * sl]) < 1e-5
            bias_grad = row.bias.grad.clone()
            dist.all_reduce(bias_grad)  # sequence-parallel params: grads summed over tp by the optimizer path
            assert relerr(bias_grad, db2) < 1e-5
        else:
            assert relerr(y, yr) < 1e-5 and relerr(xin.grad, dxr) < 1e-5
            assert relerr(row.bias.grad, db2) < 1e-5
        assert relerr(col.weight.grad, dw1[rank * fl:(rank + 1) * fl]) < 1e-5
        assert relerr(col.bias.grad, db1[rank * fl:(rank + 1) * fl]) < 1e-5
        assert relerr(row.weight.grad, dw2[:, rank * fl:(rank + 1) * fl]) < 1e-5


@pytest.mark.slow  # two spawned processes importing torch: ~12 s on the 2-core CI machine
def test_tp2_gloo():
    """tp=2, with and without sequence parallel, in one pair of processes."""
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(2, os.path.join(d, "pg")), nprocs=2, join=True)


def test_tp1_plain():
    col = TurboColumnParallelLinear(16, 32)
    row = TurboRowParallelLinear(32, 16)
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = row(torch.relu(col(x)))
    dy = torch.randn_like(y)
    y.backward(dy)
    yr, dxr, dw1, db1, dw2, db2 = _ref(x, col.weight, col.bias, row.weight, row.bias, dy)
    assert relerr(y, yr) < 1e-5 and relerr(x.grad, dxr) < 1e-5
    assert relerr(col.weight.grad, dw1) < 1e-5 and relerr(row.weight.grad, dw2) < 1e-5


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_tp1_fp8(recipe):
    """Column and row linears on the fp8 path; delayed: each layer keeps its own amax histories across calls.
    Seeded: the delayed recipe scales the second call's new draw by the first call's amax, and over 40 seeds its
    error was at most 0.075 (mean 0.041) against the 0.08 band; unseeded, one CI run drew 0.0807."""
    torch.manual_seed(0)
    col = TurboColumnParallelLinear(32, 48, fp8_recipe=recipe, dtype=torch.bfloat16, device=DEV)
    row = TurboRowParallelLinear(48, 32, fp8_recipe=recipe, dtype=torch.bfloat16, device=DEV)
    assert (col.fp8_delayed is not None) == (recipe == "delayed") == (row.fp8_delayed is not None)
    for _ in range(2):
        x = torch.randn(20, 32, device=DEV).to(torch.bfloat16).requires_grad_()
        h = col(x)
        y = row(h)
        y.backward(torch.ones_like(y))
        hr = x.detach().double() @ col.weight.detach().double().t() + col.bias.detach().double()
        yr = h.detach().double() @ row.weight.detach().double().t() + row.bias.detach().double()
        assert relerr(h, hr) < 0.08 and relerr(y, yr) < 0.08
        assert torch.isfinite(col.weight.grad).all() and torch.isfinite(row.weight.grad).all()
    if recipe == "delayed":
        assert col.fp8_delayed is not row.fp8_delayed
        assert all(s.calls == 2 for s in (col.fp8_delayed.x, col.fp8_delayed.w, col.fp8_delayed.dy, row.fp8_delayed.x))
