"""Every parallel layout trains like one process: the parity matrix of tests/parity.py (layouts, tolerances and why).

One launch per (world size, backend) runs all of its layouts one after the other on one process group (the trainers
leave a process group they did not create alone), so the matrix costs a few interpreter starts, not one per layout.
The layouts marked `ci` run in `make test`; the whole matrix runs under `make test-scale` (marker `scale`).

TorchTitan draws each shard's initial weights from the local CPU generator (DTensor's layout-independent RNG exists
for CUDA-like devices only), so on CPU every layout would start from a different model; its runs set every
parameter from its name and global shape first (the reference too), then train with TorchTitan's own step.
Megatron-core's init is layout-independent already (weights drawn at full size, then split), and is left alone.
"""
import pytest

from parity import MATRIX, REL, Layout
from rank_script import run_rank_configs

SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist

sys.path.insert(0, "tests")  # the launch's cwd is the repository root
from parity import set_same_weights

from primus.config.validate import validate
from primus.context import resolve


def torchtitan_losses(overrides, run_dir):
    from primus.backends.megatron.testing import compose
    from primus.backends.torchtitan.trainer import TorchTitanTrainer

    cfg = compose(overrides)
    ctx = resolve(cfg, run_dir)
    validate(cfg, ctx)
    tr = TorchTitanTrainer(cfg, ctx)
    try:
        info = tr.setup()
        for part in tr.tt.model_parts:
            set_same_weights(part)
        return info["parallel_dims"], [tr.train_step(s).loss for s in range(1, cfg.training.train_iters + 1)]
    finally:
        tr.close()


torch.set_num_threads(1)
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    dist.init_process_group("gloo")  # one group for every layout of this launch
for i, overrides in enumerate(json.loads(sys.argv[2])):
    run_dir = os.path.join(sys.argv[1], str(i))
    os.makedirs(run_dir, exist_ok=True)
    if "backend=torchtitan" in overrides:
        dims, losses = torchtitan_losses(overrides, run_dir)
    else:
        from primus.backends.megatron.testing import train_steps
        _, info, losses = train_steps(overrides, run_dir)
        dims = info.get("parallel") if isinstance(info, dict) else None
    print("RESULT " + json.dumps({"config": i, "rank": int(os.environ.get("RANK", 0)), "losses": losses,
                                  "dims": dims}), flush=True)
'''


def run_layouts(tmp_path, name, nproc, configs):
    """rank 0's result for each configuration, all run in one launch of nproc processes."""
    return [ranks[0] for ranks in run_rank_configs(tmp_path, name, SCRIPT, configs, nproc, timeout=1200)]


def check(layout: Layout, ref, got) -> None:
    assert len(got) == len(ref) == 4, (layout.name, got)
    if layout.exact:
        assert got == ref, f"{layout.backend} {layout.name}: {got} != one process {ref} (bitwise expected)"
    else:
        for step, (a, b) in enumerate(zip(ref, got), 1):
            assert abs(a - b) <= REL * abs(a), (f"{layout.backend} {layout.name} step {step}: {b} vs one process "
                                                f"{a} (rel {abs(a - b) / abs(a):.1e} > {REL:.1e})", ref, got)
    assert ref[-1] < ref[0], ref  # the compared steps trained


def run_matrix(tmp_path, layouts):
    """References (one process, every model the layouts use), then each world size's layouts in one launch."""
    runnable = [l for l in layouts if not l.refused]
    by_backend = {}
    for l in runnable:
        by_backend.setdefault(l.backend, []).append(l)
    for backend, ls in by_backend.items():
        ref_args = sorted({tuple(l.reference()) for l in ls})
        refs = dict(zip(ref_args, (r["losses"] for r in run_layouts(
            tmp_path, f"{backend}_ref.py", 1, [list(a) for a in ref_args]))))
        for nproc in sorted({l.nproc for l in ls}):
            group = [l for l in ls if l.nproc == nproc]
            results = run_layouts(tmp_path, f"{backend}_{nproc}.py", nproc, [l.args() for l in group])
            for l, r in zip(group, results):
                ref = refs[tuple(l.reference())]
                print(f"{backend} {l.name}: {r['losses']} (one process: {ref})")
                check(l, ref, r["losses"])


@pytest.mark.e2e
@pytest.mark.xdist_group("parity")
def test_ci_layouts_train_like_one_process(tmp_path):
    run_matrix(tmp_path, [l for l in MATRIX if l.ci])


@pytest.mark.scale
@pytest.mark.xdist_group("parity")
def test_every_layout_trains_like_one_process(tmp_path):
    run_matrix(tmp_path, MATRIX)


@pytest.mark.parametrize("layout", [l for l in MATRIX if l.refused], ids=lambda l: f"{l.backend}-{l.name}")
def test_refused_layouts_are_refused_before_start(layout):
    """A layout the matrix cannot run is refused by validation, naming its key, before anything starts."""
    from primus.backends.megatron.testing import compose
    from primus.config.errors import ConfigError
    from primus.config.validate import validate
    from primus.context import RunContext

    cfg = compose(layout.args())
    key = layout.overrides[0].split("=")[0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg, RunContext(device="cpu", world_size=layout.nproc))
