"""Uneven pipeline stages (parallel.decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers): the rules,
the layer placement against megatron-core's own, the megatron / TorchTitan mapping, the planner, the importer, and a
2-rank megatron run whose stages hold 1 and 3 layers and train bitwise like one process."""
import pytest

from conftest import compose_cfg
from parity import COMMON
from primus.config.errors import ConfigError
from primus.config.validate import validate
from primus.context import RunContext
from primus.features import parallel
from primus.features.parallel import split_of, stage_layer_ids

PP2 = "parallel.pipeline_model_parallel_size=2"
FIRST = "parallel.decoder_first_pipeline_num_layers"
LAST = "parallel.decoder_last_pipeline_num_layers"


def check(overrides, world=2):
    cfg = compose_cfg(overrides)
    validate(cfg, RunContext(device="cpu", world_size=world))
    return cfg


def error_of(overrides, world=2):
    with pytest.raises(ConfigError) as e:
        check(overrides, world)
    return str(e.value)


@pytest.mark.parametrize("args, counts", [
    ((4, 2, None, 1, None), [1, 3]),
    ((4, 2, None, None, 1), [3, 1]),
    ((4, 2, None, 1, 3), [1, 3]),
    ((4, 3, None, 1, 1), [1, 2, 1]),
    ((61, 8, None, 5, None), [5, 8, 8, 8, 8, 8, 8, 8]),  # DeepSeek-V3's 61 layers
    ((126, 8, None, 15, 15), [15, 16, 16, 16, 16, 16, 16, 15]),
    ((12, 4, 2, 2, 2), [2, 4, 4, 2]),
    ((8, 2, None, None, None), [4, 4]),
])
def test_split_of_valid(args, counts):
    assert split_of(*args) == (counts, "")


@pytest.mark.parametrize("args, why", [
    ((4, 2, None, 2, 3), "first + last must equal num_layers=4"),
    ((10, 4, None, 2, None), "8 layers left after the first / last stages must split evenly"),
    ((4, 2, None, 0, None), "between 1 and num_layers - 1"),
    ((4, 2, None, 4, None), "between 1 and num_layers - 1"),
    ((4, 1, None, 1, None), "pipeline_model_parallel_size >= 2"),
    ((8, 2, 2, 1, None), "multiples of 2"),  # the first stage's 1 layer cannot split into 2 virtual chunks
    ((12, 4, 2, 2, 4), "multiples of 2"),  # 6 middle layers over 2 stages: 3 each, not a multiple of 2
])
def test_split_of_invalid(args, why):
    counts, reason = split_of(*args)
    assert counts is None and why in reason, reason


@pytest.mark.parametrize("num_layers, pp, vp, first, last", [
    (4, 2, None, 1, None), (4, 2, None, None, 1), (10, 4, None, 1, 3), (61, 8, None, 5, None),
    (12, 4, 2, 2, 2), (16, 4, 2, 4, None), (16, 2, 2, None, 6), (8, 2, 2, None, None), (8, 4, None, None, None),
])
def test_layer_ids_match_megatron_core(num_layers, pp, vp, first, last):
    """Each pp rank's global layer ids, as megatron-core 0.16.1 places them (get_num_layers_to_build and
    get_transformer_layer_offset, per virtual stage): the planner and the TorchTitan split use the same ids."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    tc = TransformerConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=4,
                           pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp,
                           num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                           pipeline_dtype=__import__("torch").float32)
    from types import SimpleNamespace

    from primus.features.parallel import ParallelConfig

    cfg = SimpleNamespace(model=SimpleNamespace(num_layers=num_layers), parallel=ParallelConfig(
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp,
        decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last))
    seen = []
    for rank in range(pp):
        theirs = []
        for v in (range(vp) if vp else [None]):
            n = get_num_layers_to_build(tc, vp_stage=v, pp_rank=rank)
            start = get_transformer_layer_offset(tc, vp_stage=v, pp_rank=rank)
            theirs += range(start, start + n)
        assert stage_layer_ids(cfg, pp, vp, rank) == theirs, rank
        seen += theirs
    assert sorted(seen) == list(range(num_layers))


def test_uneven_split_is_valid_and_mapped_to_megatron_core():
    from primus.backends.megatron.args import build_args

    cfg = check(["model=debug", PP2, f"{FIRST}=1"])
    args = build_args(cfg, RunContext(device="cpu", world_size=2))
    tc = args["transformer_config"]
    assert tc["num_layers_in_first_pipeline_stage"] == 1 and "num_layers_in_last_pipeline_stage" not in tc
    even = build_args(check(["model=debug", PP2]), RunContext(device="cpu", world_size=2))["transformer_config"]
    assert "num_layers_in_first_pipeline_stage" not in even  # an even split leaves megatron's defaults


def test_megatron_transformer_config_accepts_the_mapping():
    from primus.backends.megatron.args import build_args
    from primus.backends.megatron.trainer import transformer_config_from

    cfg = check(["model=debug", "model.num_layers=6", "parallel.pipeline_model_parallel_size=2",
                 f"{FIRST}=2", f"{LAST}=4"])
    tc = transformer_config_from(build_args(cfg, RunContext(device="cpu", world_size=2))["transformer_config"])
    assert (tc.num_layers_in_first_pipeline_stage, tc.num_layers_in_last_pipeline_stage) == (2, 4)


def test_layers_that_do_not_divide_name_keys_values_and_fix():
    msg = error_of(["model=debug", "model.num_layers=10", "parallel.pipeline_model_parallel_size=4", f"{FIRST}=2"],
                   world=4)
    assert FIRST in msg and "model.num_layers" in msg and "'first': 2" in msg
    assert "8 layers left" in msg and f"set {FIRST} to one of [1, 4, 7]" in msg


def test_both_ends_that_do_not_add_up_on_pp2():
    msg = error_of(["model=debug", PP2, f"{FIRST}=2", f"{LAST}=3"])
    assert FIRST in msg and LAST in msg and "first + last must equal num_layers=4" in msg
    assert f"set {LAST} to one of [2]" in msg


def test_uneven_split_needs_pipeline_parallel():
    msg = error_of(["model=debug", f"{LAST}=1"], world=1)
    assert LAST in msg and "pipeline_model_parallel_size >= 2" in msg and f"{LAST}=null" in msg


def test_virtual_stages_need_multiples_of_vp():
    msg = error_of(["model=debug", "model.num_layers=8", PP2, "parallel.virtual_pipeline_model_parallel_size=2",
                    f"{FIRST}=1"])
    assert "parallel.virtual_pipeline_model_parallel_size" in msg and "multiples of 2" in msg
    assert f"set {FIRST} to one of [2, 4, 6]" in msg
    check(["model=debug", "model.num_layers=8", PP2, "parallel.virtual_pipeline_model_parallel_size=2",
           f"{FIRST}=2"])


def test_an_uneven_layer_count_no_longer_needs_to_divide_by_pp():
    """DeepSeek-V3's 61 layers over 8 stages: 5 on the first, 8 on each other."""
    check(["model=debug", "model.num_layers=61", "parallel.pipeline_model_parallel_size=8", f"{FIRST}=5"], world=8)
    msg = error_of(["model=debug", "model.num_layers=61", "parallel.pipeline_model_parallel_size=8"], world=8)
    assert "divide evenly" in msg and f"split unevenly: {FIRST}=5" in msg  # the even-split error offers it


@pytest.mark.parametrize("args, first", [((126, 8, None), 14), ((61, 8, None), 5), ((94, 4, None), 22),
                                         ((61, 16, None), 1), ((5, 2, None), 2), ((7, 2, 2), None),
                                         ((10, 2, 2), 4), ((4, 1, None), None)])
def test_lighter_first_stage_suggestion(args, first):
    """Llama 3.1 405B's 126 layers over pp 8, DeepSeek-V3's 61 over 8 and 16, Qwen3 235B's 94 over 4."""
    assert parallel.lighter_first_stage(*args) == first
    if first:
        counts = split_of(*args, first, None)[0]
        assert counts[0] == first <= min(counts[1:])


def test_torchtitan_gets_an_explicit_split():
    from primus.backends.torchtitan.args import build_args

    cfg = check(["backend=torchtitan", "model=debug", PP2, f"{LAST}=1", "precision.bf16=false",
                 "precision.mixed_precision_param=float32"])
    par = build_args(cfg, RunContext(device="cpu", world_size=2))["parallelism"]
    assert par["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0", "layers.1", "layers.2"],
                                                 ["layers.3", "norm", "output"]]
    assert "pipeline_parallel_layers_per_stage" not in par


def test_torchtitan_refuses_uneven_with_virtual_stages():
    msg = error_of(["backend=torchtitan", "model=debug", "model.num_layers=8", PP2, "parallel.sequence_parallel=false",
                    "parallel.virtual_pipeline_model_parallel_size=2", f"{FIRST}=2"])
    assert FIRST in msg and "parallel.virtual_pipeline_model_parallel_size" in msg and "interleaved" in msg


def test_planner_sizes_the_stage_with_the_most_layers():
    from primus.plan.gpus import lookup
    from primus.plan.memory import estimate_memory, layout_of, stage_params

    base = ["model=debug", "model.num_layers=10", "parallel.pipeline_model_parallel_size=4", "launcher.nproc_per_node=4",
            "training.micro_batch_size=1", "training.global_batch_size=8"]
    cfg = compose_cfg([*base, f"{FIRST}=1", f"{LAST}=1"])
    lay = layout_of(cfg, 4)
    assert [stage_params(cfg, lay, s).layers for s in range(4)] == [1, 4, 4, 1]
    gpu = lookup("H200")
    bd = estimate_memory(cfg, gpu, 4)
    assert bd.stage == 1  # a middle stage, which the even split never made the busiest
    assert bd.params_numel == stage_params(cfg, lay, 1).total and bd.stage_layers == 4


def test_dry_run_summary_lists_layers_per_stage():
    from primus.run import resolved_summary

    cfg = check(["model=debug", PP2, f"{FIRST}=1"])
    assert resolved_summary(cfg, RunContext(device="cpu", world_size=2))["layers_per_pipeline_stage"] == [1, 3]
    one = compose_cfg(["model=debug"])
    assert "layers_per_pipeline_stage" not in resolved_summary(one, RunContext(device="cpu", world_size=1))


def test_importer_maps_megatron_lm_keys():
    from primus.importer.keys import MEGATRON as MEGATRON_KEYS

    m = {"decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": None}
    assert MEGATRON_KEYS["decoder_first_pipeline_num_layers"].fn(5, m) == {FIRST: 5}
    assert MEGATRON_KEYS["decoder_last_pipeline_num_layers"].fn(None, m) == {}
    assert MEGATRON_KEYS["decoder_last_pipeline_num_layers"].fn(8, m) == {LAST: 8}


SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist

from primus.backends.megatron.trainer import MegatronTrainer
from primus.backends.megatron.testing import compose
from primus.config.validate import validate
from primus.context import resolve

torch.set_num_threads(1)
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    dist.init_process_group("gloo")
for i, overrides in enumerate(json.loads(sys.argv[2])):
    run_dir = os.path.join(sys.argv[1], str(i))
    os.makedirs(run_dir, exist_ok=True)
    cfg = compose(overrides)
    ctx = resolve(cfg, run_dir)
    validate(cfg, ctx)
    tr = MegatronTrainer(cfg, ctx)
    try:
        tr.setup()
        chunk = tr.model[0].module
        chunk = getattr(chunk, "module", chunk)
        layers = [l.layer_number - 1 for l in chunk.decoder.layers]
        recomputed = getattr(chunk, "primus_recomputed_layer_ids", [])
        losses = [tr.train_step(s).loss for s in range(1, cfg.training.train_iters + 1)]
    finally:
        tr.close()
    print("RESULT " + json.dumps({"config": i, "rank": int(os.environ.get("RANK", 0)), "losses": losses,
                                  "layers": layers, "recomputed": recomputed}), flush=True)
'''


@pytest.mark.e2e
def test_megatron_uneven_stages_train_like_one_process(tmp_path):
    """pp2 with 1 layer on the first stage and 3 on the last (and layers 1 and 3 recomputed by global id): each rank
    builds its layers with their global numbers, and the losses equal, bitwise, those of dp2 with one micro batch per
    rank, which the parity matrix holds bitwise to one process (one 2-rank launch runs both)."""
    from rank_script import run_rank_configs

    job = [*COMMON, "model=debug", "recompute.recompute_granularity=full", "recompute.recompute_layer_ids=[1,3]"]
    dp2, pp2 = run_rank_configs(tmp_path, "two.py", SCRIPT, [job, [*job, PP2, f"{FIRST}=1"]], 2, timeout=600)
    assert [r["layers"] for r in dp2] == [[0, 1, 2, 3]] * 2
    assert [r["layers"] for r in pp2] == [[0], [1, 2, 3]]
    assert [r["recomputed"] for r in pp2] == [[], [1, 3]]
    assert pp2[0]["losses"] == dp2[0]["losses"], (dp2[0]["losses"], pp2[0]["losses"])
    assert dp2[0]["losses"][-1] < dp2[0]["losses"][0]


TT_SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist

from primus.backends.megatron.testing import compose
from primus.backends.torchtitan.trainer import TorchTitanTrainer
from primus.config.validate import validate
from primus.context import resolve

torch.set_num_threads(1)
dist.init_process_group("gloo")
overrides = json.loads(sys.argv[2])[0]
cfg = compose(overrides)
ctx = resolve(cfg, sys.argv[1])
validate(cfg, ctx)
tr = TorchTitanTrainer(cfg, ctx)
try:
    tr.setup()
    parts = [sorted(n for n, _ in p.named_children()) + sorted(p.layers.keys()) for p in tr.tt.model_parts]
    losses = [tr.train_step(s).loss for s in range(1, cfg.training.train_iters + 1)]
finally:
    tr.close()
print("RESULT " + json.dumps({"config": 0, "rank": int(os.environ["RANK"]), "parts": parts, "losses": losses}),
      flush=True)
'''


@pytest.mark.scale
def test_torchtitan_uneven_stages_hold_their_layers(tmp_path):
    """TorchTitan's pipeline split follows module_fqns_per_model_part: 3 layers and the embedding on rank 0, the last
    layer, the norm and the output on rank 1 (its losses against one process: the parity matrix, tests/parity.py)."""
    from parity import TORCHTITAN
    from rank_script import run_rank_configs

    job = [*COMMON, *TORCHTITAN, "model=debug", PP2, f"{LAST}=1"]
    two, = run_rank_configs(tmp_path, "tt.py", TT_SCRIPT, [job], 2, timeout=600)
    assert two[0]["parts"] == [["layers", "tok_embeddings", "0", "1", "2"]]
    assert two[1]["parts"] == [["layers", "norm", "output", "3"]]
    assert two[0]["losses"][-1] < two[0]["losses"][0]


def test_an_out_of_range_count_is_the_one_the_fix_varies():
    msg = error_of(["model=debug", "model.num_layers=6", "parallel.pipeline_model_parallel_size=3", f"{FIRST}=0",
                    f"{LAST}=2"], world=3)
    assert "between 1 and num_layers - 1 = 5" in msg and f"set {FIRST} to one of [1, 2, 3]" in msg
