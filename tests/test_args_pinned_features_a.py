"""The backend arguments and validation verdicts of a set of configs, pinned: moving the model, precision, moe and
turbo features into primus/features/ must leave every megatron-core argument, TorchTitan JobConfig key and
ConfigIssue exactly as it was. The expected values are tests/data/args_pinned_features_a.json; after an intended
change of a mapping or a rule, regenerate it with `python tests/test_args_pinned_features_a.py` and review the diff."""
import copy
import functools
import json
import os
import sys

import pytest

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from conftest import compose_cfg  # noqa: E402
from primus.config.errors import ConfigError  # noqa: E402
from primus.context import RunContext  # noqa: E402

SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "args_pinned_features_a.json")

CONTEXTS = {
    "cpu1": RunContext(device="cpu", world_size=1, run_dir="/tmp/r"),
    # judged for GPUs this machine does not have, as a dry run does: no hardware probe
    "gpu1": RunContext(device="cuda", world_size=1, run_dir="/tmp/r", planned=True),
}

_BOTH = [
    [], ["model=debug_moe"], ["precision=fp8"], ["precision=fp8_tensorwise"], ["precision=fp8_delayed"],
    ["precision=fp8_blockwise"], ["precision=fp8_rowwise"], ["precision=mxfp8"], ["precision=fp4"],
    ["precision=fp16"], ["precision=fp8", "precision.first_last_layers_bf16=true"],
    ["precision=fp8_delayed", "precision.fp8_interval=2", "precision.fp8_amax_history_len=16"],
    ["precision=fp8", "precision.float8_enable_fsdp_float8_all_gather=true"],
    ["precision=fp8_rowwise", "precision.fp8=e4m3"],
    ["turbo=megatron"], ["model=debug_moe", "turbo=megatron_moe"], ["model=debug_moe", "turbo=sync_free_stage1"],
    ["model=debug_moe", "turbo=sync_free_stage2"], ["model=debug_moe", "turbo=sync_free_stage3"],
    ["turbo=torchtitan"], ["turbo=torchtitan_fp8"], ["turbo=torchtitan_fp8", "precision=fp8_delayed"],
    ["turbo=torchtitan_fp8", "precision=mxfp8"], ["model=debug_moe", "turbo=torchtitan_moe"],
    ["turbo=torchtitan", "turbo.use_turbo_async_tp=true"],
    ["model=debug_moe", "turbo=megatron_moe", "precision=fp8", "turbo.grouped_gemm_fp8=true"],
    ["model=debug_moe", "moe=optimized"], ["model=debug_moe", "moe.moe_permute_fusion=true"],
    ["turbo.use_turbo_attention=true"], ["turbo.use_turbo_grouped_gemm=true"],
    ["model=deepseek_v2_lite", "training.seq_length=128"], ["model=qwen3_30b_a3b", "training.seq_length=128"],
    ["model=mixtral_small", "training.seq_length=128"], ["model=llama3_8b", "precision=fp8"],
    ["model.cross_entropy_loss_fusion=true", "model.cross_entropy_fusion_impl=turbo"],
    ["model.apply_rope_fusion=true", "model.bias_activation_fusion=true"],
    ["backend.layer_spec=local", "precision=fp8", "precision.fp8_fused_mlp=true"],
    ["precision=fp8", "precision.fp8_weight_cache=true", "training.global_batch_size=16"],
    ["model.mtp_num_layers=1", "model=debug_moe"],
]
EXPERIMENTS = sorted(f[:-5] for f in os.listdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                               "conf", "experiment")) if f.endswith(".yaml"))
CASES = {" ".join([f"backend={b}"] + o): [f"backend={b}"] + o for o in _BOTH for b in ("megatron", "torchtitan")}
CASES.update({f"experiment={e}": [f"experiment={e}"] for e in EXPERIMENTS})


def _plain(x):
    return json.loads(json.dumps(x, default=lambda v: getattr(v, "value", str(v)), sort_keys=True))


def _issues(issues):
    return sorted(_plain([list(i.keys), i.value, i.rule, i.fix]) for i in issues)


@functools.lru_cache(maxsize=None)
def _composed(overrides):
    return compose_cfg(list(overrides))


def observe(overrides, ctx):
    """What a dry run sees for these overrides: validate's issues, the backend's arguments, and the backend's
    capability issues on their own (validate reports them only once every other rule passes)."""
    from primus.backends import backend_args, capability_issues
    from primus.config.validate import validate

    cfg = copy.deepcopy(_composed(tuple(overrides)))
    try:
        validate(cfg, ctx)
        verdict = []
    except ConfigError as e:
        verdict = _issues(e.issues)
    cfg = copy.deepcopy(_composed(tuple(overrides)))
    return {"validate": verdict, "args": _plain(backend_args(cfg, ctx)),
            "capability": _issues(capability_issues(cfg, ctx))}


def snapshot():
    return {f"{name} @{c}": observe(o, ctx) for name, o in CASES.items() for c, ctx in CONTEXTS.items()}


@pytest.fixture(scope="module")
def pinned():
    with open(SNAPSHOT) as f:
        return json.load(f)


def test_the_pinned_set_covers_every_case(pinned):
    assert sorted(pinned) == sorted(f"{n} @{c}" for n in CASES for c in CONTEXTS)


@pytest.mark.parametrize("ctx_name", sorted(CONTEXTS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_args_and_issues_are_unchanged(pinned, name, ctx_name):
    got = observe(CASES[name], CONTEXTS[ctx_name])
    want = pinned[f"{name} @{ctx_name}"]
    assert got["args"] == want["args"]
    assert got == want


if __name__ == "__main__":
    os.makedirs(os.path.dirname(SNAPSHOT), exist_ok=True)
    with open(SNAPSHOT, "w") as f:
        json.dump(snapshot(), f, indent=1, sort_keys=True)
        f.write("\n")
    import primus

    print("wrote", SNAPSHOT, "from", primus.__file__)
