"""recompute_layer_ids: exactly the listed global layers are recomputed, also when pipeline stages split them.

Black-box: a recomputed layer runs its forward twice per micro batch (once forward, once again in backward)."""

import pytest

from rank_script import run_ranks

pytestmark = pytest.mark.slow

SCRIPT = r'''
import collections, json, sys
from megatron.core.transformer.transformer_layer import TransformerLayer
from primus.backends.megatron.testing import train_steps

counts = collections.Counter()
forward = TransformerLayer.forward
def counting_forward(self, *a, **k):
    counts[self.layer_number - 1] += 1  # megatron numbers layers globally, from 1
    return forward(self, *a, **k)
TransformerLayer.forward = counting_forward

ctx, _, losses = train_steps(sys.argv[2:], sys.argv[1], steps=2, check=False)
print("RESULT " + json.dumps({"rank": ctx.rank, "counts": counts, "losses": losses}), flush=True)
'''

BASE = ["device=cpu", "training.micro_batch_size=2", "training.global_batch_size=4", "training.seq_length=64",
        "training.lr_warmup_iters=0"]


def run(tmp_path, overrides, nproc=1):
    return run_ranks(tmp_path, "count_forwards.py", SCRIPT, [*BASE, *overrides], nproc)


def test_listed_layers_are_recomputed_and_losses_unchanged(tmp_path):
    plain = run(tmp_path, [])[0]
    ids = run(tmp_path, ["recompute=layer_ids", "recompute.recompute_layer_ids=[3,1]"])[0]
    # 2 steps x 2 micro batches: 4 forwards per layer, 8 for the recomputed ones
    assert plain["counts"] == {"0": 4, "1": 4, "2": 4, "3": 4}
    assert ids["counts"] == {"0": 4, "1": 8, "2": 4, "3": 8}
    assert ids["losses"] == pytest.approx(plain["losses"], abs=1e-6)


def test_pipeline_stages_map_local_layers_to_global_ids(tmp_path):
    """pp=2: stage 0 holds layers 0-1, stage 1 holds 2-3; ids [1, 2] are one layer on each stage."""
    r0, r1 = run(tmp_path, ["recompute=layer_ids", "recompute.recompute_layer_ids=[1,2]", "launcher.nproc_per_node=2",
                            "parallel.pipeline_model_parallel_size=2"], nproc=2)
    assert r0["counts"] == {"0": 4, "1": 8}
    assert r1["counts"] == {"2": 8, "3": 4}
    assert r0["losses"] == r1["losses"]
