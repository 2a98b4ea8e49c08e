"""Tensor-parallel linear layers on the turbo GEMM path, with the TP collectives overlapped with GEMMs.

    col = TurboColumnParallelLinear(in, out, tp_group, sequence_parallel=False, fp8_recipe=None)
    row = TurboRowParallelLinear(in, out, tp_group, sequence_parallel=False, fp8_recipe=None)
    y = row(act(col(x)))        # col: weight (out/tp, in); row: weight (out, in/tp)

GEMMs: bf16 torch.matmul (cuBLAS / hipBLASLt), or this package's fp8 linear (fp8_forward / fp8_backward) when
`fp8_recipe` is "tensorwise" | "rowwise" | "blockwise". Overlap when tp > 1:
  column, backward   the dgrad all-reduce (reduce-scatter under sequence parallel) is launched asynchronously
                     right after the dgrad GEMM and runs while the wgrad GEMM computes (bf16 and fp8).
  column, forward    sequence parallel: the input all-gather is split into `chunks` pieces; the GEMM of piece c
                     runs while piece c+1 is gathered (bf16; fp8 gathers first, then one fp8 GEMM).
  row, forward       the output all-reduce is split into `chunks` row pieces: piece c is reduced while the GEMM
                     of piece c+1 runs (bf16; fp8: one GEMM, then the collective). Sequence parallel:
                     reduce-scatter.
  row, backward      no collective without sequence parallel; with it, the dy all-gather precedes the GEMMs.
With tp == 1 (or no process group) these are plain linears on the same GEMM path. Parameters are created with
nn.Linear's init; a backend that needs its own init (megatron's init_method) copies into `.weight` afterwards.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from primus.turbo import fp8_linear as F8


def _ws(group) -> int:
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def _rank(group) -> int:
    return dist.get_rank(group) if _ws(group) > 1 else 0


# ----------------------------------------------------------------------------------------------- GEMM path


def _gemm_fwd(x2, w, b, recipe, fmt, need_w, delayed=None):
    if recipe:
        return F8.fp8_forward(x2, w, b, recipe, fmt, need_wgrad=need_w, delayed=delayed)
    y = torch.matmul(x2, w.t())
    if b is not None:
        y = y + b
    return y, None


def _gemm_bwd(st, dy2, x2, w, need_dx, need_dw, need_db, after_dgrad):
    if st is not None:
        return F8.fp8_backward(st, dy2, need_dx, need_dw, need_db, after_dgrad=after_dgrad)
    dx = dy2 @ w if need_dx else None
    if after_dgrad is not None:
        after_dgrad(dx)
    dw = (dy2.t() @ x2).to(w.dtype) if need_dw else None
    db = dy2.sum(0) if need_db else None
    return dx, dw, db


def _all_gather_rows(x2, group):
    ws = _ws(group)
    out = torch.empty((x2.shape[0] * ws, *x2.shape[1:]), dtype=x2.dtype, device=x2.device)
    dist.all_gather_into_tensor(out, x2.contiguous(), group=group)
    return out


def _reduce_scatter_rows(x2, group, async_op=False):
    ws = _ws(group)
    out = torch.empty((x2.shape[0] // ws, *x2.shape[1:]), dtype=x2.dtype, device=x2.device)
    h = dist.reduce_scatter_tensor(out, x2.contiguous(), group=group, async_op=async_op)
    return out, h


# ------------------------------------------------------------------------------------------------- column


class _ColumnFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, b, group, sp, recipe, fmt, chunks, delayed=None):
        ws = _ws(group)
        if sp and ws > 1 and not recipe and chunks > 1 and x2.shape[0] % chunks == 0:
            # chunked all-gather overlapped with the GEMMs of the pieces already gathered
            n_loc = x2.shape[0]
            c = n_loc // chunks
            full = torch.empty((n_loc * ws, x2.shape[1]), dtype=x2.dtype, device=x2.device)
            y = torch.empty((n_loc * ws, w.shape[0]), dtype=x2.dtype, device=x2.device)
            bufs, hs = [], []
            for i in range(chunks):
                buf = torch.empty((c * ws, x2.shape[1]), dtype=x2.dtype, device=x2.device)
                hs.append(dist.all_gather_into_tensor(buf, x2[i * c:(i + 1) * c].contiguous(), group=group,
                                                      async_op=True))
                bufs.append(buf)
            for i in range(chunks):
                hs[i].wait()
                part = torch.matmul(bufs[i], w.t())
                if b is not None:
                    part = part + b
                for r in range(ws):  # rank-major order of the full gather
                    rows = slice(r * n_loc + i * c, r * n_loc + (i + 1) * c)
                    y[rows] = part[r * c:(r + 1) * c]
                    full[rows] = bufs[i][r * c:(r + 1) * c]
            x_full, st = full, None
        else:
            x_full = _all_gather_rows(x2, group) if (sp and ws > 1) else x2
            y, st = _gemm_fwd(x_full, w, b, recipe, fmt, ctx.needs_input_grad[1], delayed)
        if st is not None:
            ctx.save_for_backward(w, *st.tensors)
            st.tensors = None
        else:
            ctx.save_for_backward(w, x_full)
        ctx.st, ctx.group, ctx.sp = st, group, sp
        return y

    @staticmethod
    def backward(ctx, dy2):
        w, *rest = ctx.saved_tensors
        st, group, sp = ctx.st, ctx.group, ctx.sp
        x_full = None
        if st is not None:
            st.tensors = rest
        else:
            x_full = rest[0]
        ws = _ws(group)
        pending = {}

        def launch(dx):  # overlap: the dgrad collective runs during the wgrad GEMM
            if dx is None or ws == 1:
                return
            if sp:
                pending["out"], pending["h"] = _reduce_scatter_rows(dx, group, async_op=True)
            else:
                pending["h"] = dist.all_reduce(dx, group=group, async_op=True)
                pending["out"] = dx

        dx, dw, db = _gemm_bwd(st, dy2.contiguous(), x_full, w, ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                               ctx.needs_input_grad[2], launch)
        if "h" in pending:
            pending["h"].wait()
            dx = pending["out"]
        return dx, dw, db, None, None, None, None, None, None


# ---------------------------------------------------------------------------------------------------- row


class _RowFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, b, group, sp, recipe, fmt, chunks, delayed=None):
        ws = _ws(group)
        M = x2.shape[0]
        if ws > 1 and not sp and not recipe and chunks > 1 and M >= chunks:
            y = torch.empty((M, w.shape[0]), dtype=x2.dtype, device=x2.device)
            hs = []
            bounds = [M * i // chunks for i in range(chunks + 1)]
            for i in range(chunks):  # GEMM of piece i+1 overlaps the all-reduce of piece i
                part = y[bounds[i]:bounds[i + 1]]
                torch.matmul(x2[bounds[i]:bounds[i + 1]], w.t(), out=part)
                hs.append(dist.all_reduce(part, group=group, async_op=True))
            for h in hs:
                h.wait()
            st = None
        else:
            y, st = _gemm_fwd(x2, w, None, recipe, fmt, ctx.needs_input_grad[1], delayed)
            if ws > 1:
                if sp:
                    y, _ = _reduce_scatter_rows(y, group)
                else:
                    dist.all_reduce(y, group=group)
        if b is not None:
            y = y + b
        if st is not None:
            ctx.save_for_backward(w, *st.tensors)
            st.tensors = None
        else:
            ctx.save_for_backward(w, x2)
        ctx.st, ctx.group, ctx.sp, ctx.has_b = st, group, sp, b is not None
        return y

    @staticmethod
    def backward(ctx, dy2):
        w, *rest = ctx.saved_tensors
        st, group, sp = ctx.st, ctx.group, ctx.sp
        x2 = None
        if st is not None:
            st.tensors = rest
        else:
            x2 = rest[0]
        dy2 = dy2.contiguous()
        db = dy2.sum(0) if (ctx.has_b and ctx.needs_input_grad[2]) else None  # bias is added after the reduction
        if sp and _ws(group) > 1:
            dy2 = _all_gather_rows(dy2, group)
        if st is not None:
            st.has_bias = False
        dx, dw, _ = _gemm_bwd(st, dy2, x2, w, ctx.needs_input_grad[0], ctx.needs_input_grad[1], False, None)
        return dx, dw, db, None, None, None, None, None, None


# ------------------------------------------------------------------------------------------------ modules


class _TPLinear(nn.Module):
    def __init__(self, in_features, out_features, tp_group, bias, sequence_parallel, fp8_recipe, fp8_format, chunks,
                 device, dtype, shard_out: bool):
        super().__init__()
        ws = _ws(tp_group)
        dim = out_features if shard_out else in_features
        if dim % ws:
            raise ValueError(f"{'out' if shard_out else 'in'}_features {dim} is not divisible by tp={ws}")
        self.in_features, self.out_features = in_features, out_features
        self.local_in = in_features if shard_out else in_features // ws
        self.local_out = out_features // ws if shard_out else out_features
        self.tp_group, self.sequence_parallel, self.chunks = tp_group, sequence_parallel, chunks
        self.fp8_recipe = getattr(fp8_recipe, "value", fp8_recipe)
        self.fp8_format = getattr(fp8_format, "value", fp8_format)
        if self.fp8_recipe and self.fp8_recipe not in F8.RECIPES:
            raise ValueError(f"fp8_recipe must be None or one of {F8.RECIPES}")
        # recipe "delayed": this layer's amax histories (TE's defaults; pass fp8_recipe="delayed" + set
        # `.fp8_delayed = DelayedScaling(...).linear_state()` for others)
        self.fp8_delayed = F8.DelayedScaling().linear_state() if self.fp8_recipe == "delayed" else None
        lin = nn.Linear(self.local_in, self.local_out, bias=bias, device=device, dtype=dtype)
        self.weight = lin.weight
        self.bias = lin.bias

    def _x2(self, x):
        return x.reshape(-1, x.shape[-1])


class TurboColumnParallelLinear(_TPLinear):
    """y_local = x @ W_local^T + b_local; W (out/tp, in). Input replicated (or sequence-sharded with sp)."""

    def __init__(self, in_features, out_features, tp_group=None, bias=True, sequence_parallel=False,
                 fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3", chunks: int = 2, device=None,
                 dtype=None):
        super().__init__(in_features, out_features, tp_group, bias, sequence_parallel, fp8_recipe, fp8_format,
                         chunks, device, dtype, shard_out=True)

    def forward(self, x):
        lead = list(x.shape[:-1])
        y = _ColumnFn.apply(self._x2(x), self.weight, self.bias, self.tp_group, self.sequence_parallel,
                            self.fp8_recipe, self.fp8_format, self.chunks, self.fp8_delayed)
        if self.sequence_parallel and _ws(self.tp_group) > 1:
            lead[0] = lead[0] * _ws(self.tp_group)  # rows gathered along the first (sequence) dim
        return y.view(*lead, y.shape[-1])


class TurboRowParallelLinear(_TPLinear):
    """y = all_reduce(x_local @ W_local^T) + b; W (out, in/tp). Input split on the last dim."""

    def __init__(self, in_features, out_features, tp_group=None, bias=True, sequence_parallel=False,
                 fp8_recipe: Optional[str] = None, fp8_format: str = "e4m3", chunks: int = 2, device=None,
                 dtype=None):
        super().__init__(in_features, out_features, tp_group, bias, sequence_parallel, fp8_recipe, fp8_format,
                         chunks, device, dtype, shard_out=False)

    def forward(self, x):
        lead = list(x.shape[:-1])
        y = _RowFn.apply(self._x2(x), self.weight, self.bias, self.tp_group, self.sequence_parallel,
                         self.fp8_recipe, self.fp8_format, self.chunks, self.fp8_delayed)
        if self.sequence_parallel and _ws(self.tp_group) > 1:
            lead[0] = lead[0] // _ws(self.tp_group)
        return y.view(*lead, y.shape[-1])
