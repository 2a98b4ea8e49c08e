"""The profiler's per-phase table: attribution of forward and backward ops to phase ranges (unit, a real torch
profile on CPU), the table's rows, and a megatron MoE run whose table has every MoE phase and whose losses are
those of the unprofiled run (e2e)."""
import json
import os
import re

import pytest
import torch

from primus.metrics import phases
from test_launch_common import run_train, tail


def _profiled_step():
    """A real CPU profile: phase "experts" around one linear, "attention" around another, loss outside any range."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
    x = torch.randn(16, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function(phases.PREFIX + "attention"):
            h = a(x)
        with torch.profiler.record_function(phases.PREFIX + "experts"):
            y = b(h).relu()
        (y * y).mean().backward()
    return prof.events()


def _forward_only(events, phase):
    """Self CPU time of the aten ops inside the phase's forward range."""
    total = 0.0
    for e in events:
        x = e.cpu_parent
        while x is not None and not x.name.startswith(phases.PREFIX):
            x = x.cpu_parent
        if e.name.startswith("aten::") and x is not None and x.name == phases.PREFIX + phase:
            total += e.self_cpu_time_total
    return total


def test_backward_ops_count_for_the_phase_of_their_forward_op():
    events = _profiled_step()
    per, total = phases.phase_breakdown(events, on_gpu=False)
    aten = sum(e.self_cpu_time_total for e in events if e.name.startswith("aten::"))
    assert total == pytest.approx(aten)
    assert sum(per.values()) == pytest.approx(total)
    # the backward mm's of each linear (AddmmBackward0) land in its phase, beyond what its forward range holds
    bwd_mm = {}
    for e in events:
        if e.name == "aten::mm":
            node = e.cpu_parent
            while node is not None and not node.name.startswith("autograd::engine::evaluate_function:"):
                node = node.cpu_parent
            assert node is not None  # the forward used addmm: every mm here is a backward one
            bwd_mm.setdefault((node.fwd_thread, node.sequence_nr), 0.0)
            bwd_mm[(node.fwd_thread, node.sequence_nr)] += e.self_cpu_time_total
    assert len(bwd_mm) == 2
    for p in ("attention", "experts"):
        assert per[p] > _forward_only(events, p) > 0
    assert per["attention"] + per["experts"] >= _forward_only(events, "attention") + _forward_only(
        events, "experts") + sum(bwd_mm.values()) - 1e-6
    # the loss (mul, mean) and its backward are in no range
    assert per[phases.OTHER] > 0
    assert per["router"] == per["optimizer"] == 0.0


def _ev(name, parent=None, kernels=(), seq=-1, thread=1, fwd_thread=0, device="DeviceType.CPU", us=0.0,
        annotation=False):
    from types import SimpleNamespace

    from torch.autograd.profiler_util import Interval, Kernel

    return SimpleNamespace(name=name, key=name, cpu_parent=parent, kernels=[Kernel(k, 0, d) for k, d in kernels],
                           sequence_nr=seq, thread=thread, fwd_thread=fwd_thread, device_type=device,
                           time_range=Interval(0, us), is_user_annotation=annotation, self_cpu_time_total=0.0)


def test_gpu_time_is_the_kernels_each_op_launched():
    """On a GPU a range's own "kernel" is its gpu_user_annotation span (kineto mirrors the range there): not
    counted; each op's kernels count for the phase of the op (forward) or of its forward op (backward); the total is
    every device kernel, so kernels of no phase are "other"."""
    rng = _ev(phases.PREFIX + "experts", kernels=[(phases.PREFIX + "experts", 500.0)], annotation=True)
    fwd = _ev("aten::mm", parent=rng, kernels=[("sm90_gemm", 40.0)], seq=7)
    node = _ev("autograd::engine::evaluate_function: MmBackward0", seq=7, thread=2, fwd_thread=1)
    bwd = _ev("aten::mm", parent=_ev("MmBackward0", parent=node, seq=7, thread=2, fwd_thread=1), thread=2,
              kernels=[("sm90_gemm", 30.0)])
    loose = _ev("aten::add", kernels=[("elementwise", 5.0)])
    dev = [_ev("sm90_gemm", device="DeviceType.CUDA", us=40.0), _ev("sm90_gemm", device="DeviceType.CUDA", us=30.0),
           _ev("elementwise", device="DeviceType.CUDA", us=5.0),
           _ev(phases.PREFIX + "experts", device="DeviceType.CUDA", us=500.0, annotation=True)]
    per, total = phases.phase_breakdown([rng, fwd, node, bwd, loose, *dev], on_gpu=True)
    assert total == 75.0
    assert per["experts"] == 70.0 and per[phases.OTHER] == 5.0
    assert sum(per.values()) == total


def test_compiled_layers_ops_name_their_phase_and_accumulation_is_its_own():
    """A compiled layer has no ranges: its router / permute / unpermute ops, grouped GEMMs and core attention count
    for their phase, forward and backward (under an autograd node the permute op is the unpermute's gradient and
    the unpermute op the permute's: they swap); its other ops stay "other". Whatever runs under an AccumulateGrad
    node (megatron's main_grad hook) is gradient accumulation; a range still wins over an op's name."""
    fwd = _ev("CompiledFunction")
    node = _ev("autograd::engine::evaluate_function: CompiledFunctionBackward", seq=3, thread=2, fwd_thread=1)
    bwd = _ev("CompiledFunctionBackward", parent=node, thread=2)
    acc = _ev("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", thread=2)
    shared = _ev(phases.PREFIX + "shared experts", annotation=True)
    ops = [  # (op, its parent, kernel us)
        ("primus::moe_router", fwd, 1.0), ("primus::moe_router_bwd", bwd, 2.0),
        ("primus::moe_permute", fwd, 10.0), ("primus::moe_unpermute", bwd, 7.0),  # dispatch/permute
        ("primus::moe_unpermute", fwd, 5.0), ("primus::moe_permute", bwd, 3.0),  # combine/unpermute
        ("aten::_grouped_mm", fwd, 20.0), ("aten::_grouped_mm", bwd, 40.0),
        ("aten::_scaled_dot_product_cudnn_attention", fwd, 9.0),
        ("aten::_scaled_dot_product_cudnn_attention_backward", bwd, 18.0),
        ("aten::add_", acc, 11.0), ("aten::mm", fwd, 13.0), ("aten::_grouped_mm", shared, 100.0)]
    evs = [fwd, node, bwd, acc, shared]
    for name, parent, us in ops:
        evs.append(_ev(name, parent=parent, kernels=[("k", us)], thread=parent.thread))
        evs.append(_ev("k", device="DeviceType.CUDA", us=us))
    # an op inside a named op (a copy in the unpermute's backward kernel op) takes the named op's phase
    bwd_op = _ev("primus::moe_unpermute_bwd", parent=bwd, thread=2)
    evs += [bwd_op, _ev("aten::copy_", parent=bwd_op, kernels=[("k", 4.0)], thread=2),
            _ev("k", device="DeviceType.CUDA", us=4.0)]
    per, total = phases.phase_breakdown(evs, on_gpu=True)
    assert total == 243.0 and sum(per.values()) == total
    assert per["router"] == 3.0
    assert per["dispatch/permute"] == 17.0 and per["combine/unpermute"] == 12.0
    assert per["experts"] == 60.0 and per["shared experts"] == 100.0 and per["attention"] == 27.0
    assert per[phases.GRAD_ACC] == 11.0 and per[phases.OTHER] == 13.0, per


def test_a_compiled_moe_chain_profiled_on_the_cpu_splits_into_its_phases():
    """The real event tree: router -> permute -> grouped GEMM -> unpermute and an attention, compiled (aot_eager,
    one graph), forward + backward under the profiler, with a main_grad hook on the experts' weight as megatron's
    DDP sets one. Every named phase gets time; the loss and the rest are "other"."""
    import torch._dynamo

    from primus.turbo import moe_ops as M

    T, E, k, H = 12, 4, 2, 16

    def chain(logits, x, w, q):
        probs, rmap, aux = M.fused_router(logits, k)
        y, py, row_map = M.permute(x, rmap, probs, num_out_tokens=T * k)
        offs = torch.cumsum(rmap.sum(0), 0).to(torch.int32)
        h = torch._grouped_mm(y, w, offs=offs) * py[:, None].to(y.dtype)
        att = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return M.unpermute(h, row_map, None).float().square().sum() + att.sum() + aux.sum()

    torch.manual_seed(0)
    logits, q = torch.randn(T, E, requires_grad=True), torch.randn(1, 2, 8, 16, requires_grad=True)
    x = torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(E, H, H, dtype=torch.bfloat16))
    w.main_grad = torch.zeros(E, H, H)

    def hook(*_):
        w.main_grad.add_(w.grad.data)
        w.grad = None

    w.expand_as(w).grad_fn.next_functions[0][0].register_hook(hook)
    torch._dynamo.reset()
    try:
        fn = torch.compile(chain, backend="aot_eager", fullgraph=True)
        fn(logits, x, w, q).backward()  # compiles
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn(logits, x, w, q).backward()
    finally:
        torch._dynamo.reset()
    events = prof.events()
    assert {"primus::moe_permute", "primus::moe_unpermute", "aten::_grouped_mm"} <= {e.name for e in events}
    per, total = phases.phase_breakdown(events, on_gpu=False)
    assert sum(per.values()) == pytest.approx(total)
    for p in ("router", "dispatch/permute", "experts", "combine/unpermute", "attention", phases.GRAD_ACC):
        assert per[p] > 0, (p, per)
    assert per["shared experts"] == per["dense MLP"] == per["optimizer"] == 0.0
    assert per[phases.OTHER] > 0  # the loss, the cumsum


def test_phase_table_rows_and_shares():
    per = {p: 0.0 for p in phases.PHASES}
    per.update({"router": 1000.0, "experts": 3000.0, phases.OTHER: 6000.0})
    table = phases.phase_table(per, 10_000.0, on_gpu=True, steps=2)
    rows = {r.split("|")[1].strip(): r for r in table.splitlines() if r.startswith("| ") and "---" not in r}
    assert list(rows)[1:] == phases.PHASES + [phases.OTHER, "total"]
    assert rows["router"] == "| router | 0.50 | 10.0% |"  # 1000 us over 2 steps
    assert rows["experts"] == "| experts | 1.50 | 30.0% |"
    assert rows["total"] == "| total | 5.00 | 100.0% |"
    assert "share of GPU kernel time" in table and "compile" not in table
    assert "3 torch.compile'd layers" in phases.phase_table(per, 10_000.0, False, 1, compiled_layers=3)
    js = phases.as_json(per, 10_000.0, 2)
    assert js["experts"] == {"ms_per_step": 1.5, "share": 0.3} and set(js) == set(phases.PHASES) | {phases.OTHER}


def test_remove_puts_back_the_attributes_it_replaced():
    class Dispatcher:
        def token_dispatch(self, x):
            return x + 1

    d = Dispatcher()
    own = lambda x: x * 10  # noqa: E731 - an instance attribute set before (as a library patch would)
    d.combine = own
    done = phases.Installed()
    done.wrap(d, "token_dispatch", "dispatch/permute")
    done.wrap(d, "combine", "combine/unpermute")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert d.token_dispatch(torch.ones(1)).item() == 2 and d.combine(torch.ones(1)).item() == 10
    names = {e.name for e in prof.events()}
    assert {phases.PREFIX + "dispatch/permute", phases.PREFIX + "combine/unpermute"} <= names
    done.remove()
    assert "token_dispatch" not in d.__dict__ and d.combine is own
    assert done.counts == {"dispatch/permute": 1, "combine/unpermute": 1}


MOE = ["model=debug_moe", "training.seq_length=64", "training.micro_batch_size=2", "training.global_batch_size=2",
       "training.train_iters=3", "training.timing_warmup_steps=0", "device=cpu"]


@pytest.mark.e2e
def test_megatron_moe_phase_table_and_unchanged_losses(tmp_path):
    plain = run_train([*MOE, f"hydra.run.dir={tmp_path / 'plain'}"])
    assert plain.returncode == 0, tail(plain)
    p = run_train([*MOE, "profile.enabled=true", "profile.start_step=2", "profile.steps=1",
                   f"hydra.run.dir={tmp_path / 'prof'}"])
    assert p.returncode == 0, tail(p)
    res = json.load(open(tmp_path / "prof" / "result.json"))
    ref = json.load(open(tmp_path / "plain" / "result.json"))
    # the ranges change no computation, and are gone after the window (step 3 runs the library's methods)
    assert res["losses"] == ref["losses"]
    table = open(tmp_path / "prof" / "profile" / "phases_rank0.md").read()
    assert os.path.isfile(tmp_path / "prof" / "profile" / "kernels_rank0.md")
    got = res["profile"]["phases"]
    for phase in ("router", "dispatch/permute", "experts", "combine/unpermute", "shared experts", "attention",
                  "gradient accumulation", "optimizer", "other"):
        assert got[phase]["ms_per_step"] > 0, (phase, table)
        row = re.search(rf"^\| {re.escape(phase)} \| ([0-9.]+) \|", table, re.M)
        # the table's 2 decimals and result.json's 3 are two roundings of one figure
        assert row and float(row.group(1)) == pytest.approx(got[phase]["ms_per_step"], abs=0.006), (phase, table)
    assert got["dense MLP"]["ms_per_step"] == 0  # every debug_moe layer is an MoE layer
    assert sum(v["share"] for v in got.values()) == pytest.approx(1.0, abs=2e-3)
    assert "[primus] step by phase" in p.stdout
