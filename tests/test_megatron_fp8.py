"""The portable fp8 path (no Transformer Engine) wires megatron's parallel linears correctly.

The fp8 GEMM itself is primus.turbo's (tested there, on GPUs). Here it is replaced by a plain linear that counts its
calls, so a CPU run checks the wiring: which linears are converted (first/last layers kept in bf16), and that the
tensor-parallel communication around the converted GEMMs is right (tp=2 with sequence parallel matches 1 process).
"""

import pytest

from rank_script import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    __import__("importlib").util.find_spec("triton") is None, reason="primus.turbo.fp8_linear needs triton")]

SCRIPT = r'''
import json, sys
import torch
import primus.turbo.fp8_linear as f8
from primus.backends.megatron import args as margs

calls = {"n": 0, "states": set(), "recipes": set()}
def plain_linear(x, weight, bias=None, recipe="tensorwise", fmt="e4m3", delayed=None):
    calls["n"] += 1
    calls["recipes"].add(recipe)
    if delayed is not None:
        assert recipe == "delayed" and isinstance(delayed, f8.DelayedLinearState)
        calls["states"].add((id(delayed), id(weight), delayed.settings.history_len, delayed.settings.margin,
                             delayed.settings.algo))
    return torch.nn.functional.linear(x, weight, bias)
f8.fp8_linear = plain_linear
margs.portable_fp8_available = lambda recipe=None: True  # a CPU has no fp8: pretend, the GEMM is plain anyway

from primus.backends.megatron.testing import train_steps

# check=False: not validate(), fp8 on CPU is (rightly) refused there
ctx, info, losses = train_steps(sys.argv[2:], sys.argv[1], steps=3, check=False)
print("RESULT " + json.dumps({"rank": ctx.rank, "losses": losses, "calls": calls["n"],
                              "recipes": sorted(calls["recipes"]), "states": sorted(calls["states"]),
                              "converted": info.get("fp8_linears_on_this_rank", 0)}), flush=True)
'''

BASE = ["device=cpu", "training.micro_batch_size=2", "training.global_batch_size=4", "training.seq_length=64",
        "training.lr_warmup_iters=0"]


def run(tmp_path, overrides, nproc=1):
    return run_ranks(tmp_path, "fp8_wiring.py", SCRIPT, [*BASE, *overrides], nproc)


def test_portable_fp8_converts_decoder_linears_and_keeps_the_math(tmp_path):
    plain = run(tmp_path, [])[0]
    fp8 = run(tmp_path, ["precision=fp8"])[0]
    assert plain["converted"] == 0 and plain["calls"] == 0
    assert fp8["converted"] == 4 * 4  # 4 layers x (qkv, proj, fc1, fc2); the output layer stays bf16
    assert fp8["calls"] == 16 * 3 * 2  # every converted linear, every micro batch (3 steps x 2)
    assert fp8["losses"] == pytest.approx(plain["losses"], abs=1e-6)
    kept = run(tmp_path, ["precision=fp8", "precision.first_last_layers_bf16=true",
                          "precision.num_layers_at_start_in_bf16=1", "precision.num_layers_at_end_in_bf16=2"])[0]
    assert kept["converted"] == 4  # only layer 1 of 0..3


def test_portable_fp8_tensor_parallel_communication(tmp_path):
    one = run(tmp_path, ["precision=fp8"])[0]
    r0, r1 = run(tmp_path, ["precision=fp8", "launcher.nproc_per_node=2", "parallel.tensor_model_parallel_size=2",
                            "parallel.sequence_parallel=true"], nproc=2)
    assert r0["converted"] == r1["converted"] == 16
    assert r0["losses"] == pytest.approx(one["losses"], abs=2e-3)


def test_portable_fp8_delayed_gives_each_linear_its_own_amax_histories(tmp_path):
    """precision=fp8_delayed without TE: the portable DelayedScaling, one state per converted linear (x, weight,
    dy histories), built from precision.fp8_amax_history_len / fp8_margin / fp8_amax_compute_algo."""
    r = run(tmp_path, ["precision=fp8_delayed", "precision.fp8_amax_history_len=16", "precision.fp8_margin=1",
                       "precision.fp8_amax_compute_algo=most_recent"])[0]
    assert r["converted"] == 16 and r["recipes"] == ["delayed"]
    assert len({tuple(s[:2]) for s in r["states"]}) == 16  # 16 states, each always with its own weight
    assert len({s[0] for s in r["states"]}) == 16
    assert {tuple(s[2:]) for s in r["states"]} == {(16, 1, "most_recent")}
