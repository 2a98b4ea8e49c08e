"""bench/at_scale.py: the at-scale rows' presets, their planner picks, the parts, and the CPU check of every entry."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import PY, ROOT, compose_cfg, modelled_gap_s
from primus.plan.advice import pick
from primus.plan.gpus import resolve_gpu
from primus.plan.memory import estimate_memory

sys.path.insert(0, os.path.join(ROOT, "bench"))
import at_scale  # noqa: E402

H200 = resolve_gpu("H200", None)
DENSE = [g for g in at_scale.GROUPS if not g.moe]
MOE = [g for g in at_scale.GROUPS if g.moe]


@pytest.mark.parametrize("g", [g for g in DENSE if not g.variants], ids=lambda g: g.name)
def test_dense_presets_are_the_planners_pick(g):
    """Each dense preset's micro batch, recompute and offload share are what `python -m primus.plan --pick` picks
    for it, and its estimate leaves 10% of the H200 free. The seq-4096 presets accumulate their linears' weight
    gradients in the GEMM (measured there: docs/benchmarks.md, at scale); the long-sequence ones, not measured with
    it, do not, and their pick is the same either way."""
    cfg = compose_cfg([f"experiment={g.preset}"])
    assert (cfg.training.seq_length, cfg.training.global_batch_size) == (g.seq, g.global_batch)
    assert cfg.plan.gpu == "H200"
    assert cfg.training.gradient_accumulation_fusion == (g.seq == 4096)
    v = pick(cfg, H200, 1)
    flipped = f"training.gradient_accumulation_fusion={str(not cfg.training.gradient_accumulation_fusion).lower()}"
    assert pick(compose_cfg([f"experiment={g.preset}", flipped]), H200, 1).overrides == v.overrides
    m, r = cfg.memory, cfg.recompute
    want = ["recompute=" + (r.recompute_granularity.value if r.recompute_granularity else "none")]
    want += (["memory=offload", f"memory.optimizer_offload_fraction={m.optimizer_offload_fraction}",
              "memory.overlap_cpu_optimizer_d2h_h2d=true"]
             if m.optimizer_cpu_offload else ["memory.optimizer_cpu_offload=false"])
    want += [f"training.micro_batch_size={cfg.training.micro_batch_size}"]
    assert v.overrides == want
    bd = estimate_memory(cfg, H200, 1)
    assert bd.needed <= 0.9 * bd.capacity
    if m.optimizer_cpu_offload:
        assert m.overlap_cpu_optimizer_d2h_h2d  # the offloaded step's transfers overlap its CPU Adam


@pytest.mark.parametrize("g", MOE, ids=lambda g: g.name)
def test_moe_presets_have_the_most_layers_that_fit_without_offload(g):
    """The MoE rows train every parameter: the layer count is the most that fits with no optimizer offload and 10%
    of the GPU free (the peers do not offload on one GPU), at the largest micro batch that does; one more layer
    fits at no micro batch. The planner picks otherwise: micro batch 4 with a quarter of Adam offloaded halves the
    micro batches' in-GEMM accumulations and passes, which the step model puts about 5% of the step ahead, its
    MoE pass term calibrated at 4-5 layers on an H100, where micro batch 4 ran 1.085-1.093x micro batch 2 (not
    measured at this depth: docs/benchmarks.md, row 2's micro batch)."""
    from primus.plan.advice import MODEL_GAIN
    from primus.plan.memory import estimate_throughput

    cfg = compose_cfg([f"experiment={g.preset}"])
    assert cfg.model.num_layers == g.layers and cfg.training.micro_batch_size == 2
    assert not cfg.memory.optimizer_cpu_offload and cfg.recompute.recompute_granularity is None
    assert not cfg.turbo.grouped_gemm_fp8  # experts this narrow ran slower in fp8 (small_experts_warning)

    def fits(layers, mb):
        bd = estimate_memory(compose_cfg([f"experiment={g.preset}", f"model.num_layers={layers}",
                                          f"training.micro_batch_size={mb}"]), H200, 1)
        return bd.needed <= 0.9 * bd.capacity
    assert fits(g.layers, 2) and not fits(g.layers, 4)
    assert not any(fits(g.layers + 1, mb) for mb in (1, 2))
    v = pick(cfg, H200, 1)
    assert v.overrides == ["recompute=none", "memory=offload", "memory.optimizer_offload_fraction=0.25",
                           "memory.overlap_cpu_optimizer_d2h_h2d=true", "training.micro_batch_size=4"], v.overrides
    moved = compose_cfg([f"experiment={g.preset}"] + v.overrides)
    gain = modelled_gap_s(cfg, moved, H200)
    assert MODEL_GAIN < 0.04 < gain / estimate_throughput(cfg, H200, 1).step_time_s < 0.06, gain


@pytest.mark.parametrize("g", at_scale.GROUPS, ids=lambda g: g.name)
def test_the_peers_run_the_presets_micro_batch(g):
    """Same shape and micro batch: the reference and stock megatron-core run the group's micro batch, the preset's;
    stock TorchTitan too, unless at that micro batch it would need activation checkpointing that its own (given) one
    does not: then the planner's estimate of it fits at its micro batch and not at the preset's."""
    assert g.micro == compose_cfg([f"experiment={g.preset}"]).training.micro_batch_size
    specs = [spec for _, spec in at_scale.points(g)]
    assert all(f"--batch {g.micro} " in s for s in specs if "reference.py" in s)
    assert all(f"--batch {g.titan_micro or g.micro} " in s for s in specs if "torchtitan_stock.py" in s)
    assert all(f"training.micro_batch_size={g.micro} " in s for s in specs if " megatron-core stock=" in s)


def test_stock_megatron_is_megatron_core_as_it_ships():
    cfg = compose_cfg(at_scale.STOCK_MEGATRON.split() + ["model=qwen3_30b_a3b", "model.num_layers=8"])
    assert cfg.backend.layer_spec.value == "local"
    assert not cfg.turbo.enable_primus_turbo
    assert cfg.moe.moe_token_dispatcher_type.value == "alltoall"
    assert not (cfg.moe.moe_grouped_gemm or cfg.moe.moe_permute_fusion)
    assert not (cfg.training.compile or cfg.model.cross_entropy_loss_fusion or cfg.model.apply_rope_fusion
                or cfg.model.bias_activation_fusion)
    assert cfg.precision.fp8 is None and not cfg.memory.optimizer_cpu_offload


def test_parts_run_each_group_three_times_with_the_same_points():
    parts = at_scale.parts()
    assert len(parts) == 3 * len(at_scale.GROUPS) == 30
    for g in at_scale.GROUPS:
        assert [r for h, r in parts if h is g] == [1, 2, 3]
        pts = at_scale.points(g)
        names = [spec.split("=", 1)[0] for _, spec in pts]
        assert names[0] == f"{g.name} megatron preset" and len(set(names)) == len(names)
        assert any("torchtitan_stock.py" in spec for _, spec in pts) == g.titan_fits
        assert not any("--offload" in spec for _, spec in pts if "torchtitan_stock.py" in spec)
        assert ("megatron-core stock" in " ".join(names)) == g.moe
        assert ("reference" in " ".join(names)) == g.reference
        assert len(names) == 1 + len(g.variants) + g.moe + g.reference + g.titan_fits
        for _, spec in pts:  # the bench batch is a whole number of micro batches at the preset's micro batch 1
            assert f"--global-batch {at_scale.bench_batch(g)}" in spec or \
                f"training.global_batch_size={at_scale.bench_batch(g)}" in spec
        checks = at_scale.points(g, check=True)
        assert all("dry_run=true" in s for f, s in checks if f == "--extra")
        assert all("--shape debug" in s and "--offload" not in s and "--compile" not in s
                   for f, s in checks if f == "--peer")


def test_unknown_part_is_refused_with_the_range(capsys):
    for bad in ("99", "0", "1-31", "2,x", "one"):
        with pytest.raises(SystemExit):
            at_scale.main([bad])
        assert "a part 1-30" in capsys.readouterr().err


def test_list_says_which_parts_cannot_take_layers_and_lists_the_rest(monkeypatch, capsys):
    monkeypatch.setenv("LAYERS", "16")
    assert at_scale.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(at_scale.parts())
    assert "llama2_7b_fp8 megatron preset" in lines[0]
    moe = [l for l in lines if "deepseek_v2_lite," in l]
    assert moe and all("cannot run: [at_scale] LAYERS=16: more than the 10 layers" in l for l in moe)


def test_parts_are_named_one_by_one_in_ranges_or_all():
    assert at_scale.part_numbers("7") == [7]
    assert at_scale.part_numbers("1-3,13") == [1, 2, 3, 13]
    assert at_scale.part_numbers("all") == list(range(1, len(at_scale.parts()) + 1))


@pytest.mark.slow
def test_cpu_check_runs_every_entry_of_a_dense_and_a_moe_group(tmp_path):
    """`bench/at_scale.sh --check`: the presets' train.py commands as dry runs, the reference and stock TorchTitan
    at the debug shapes (float8 included), stock megatron-core's command, a VARIANTS point; every row ok."""
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=PY, VARIANTS="mb1:training.micro_batch_size=1")
    r = subprocess.run(["bash", "bench/at_scale.sh", "--check", "--only", "llama2_7b_fp8", "qwen3_30b_a3b"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for g in ("llama2_7b_fp8", "qwen3_30b_a3b"):
        rows = json.load(open(tmp_path / f"bench_atscale_check_{g}.json"))["rows"]
        assert len(rows) == 4 and all(row["status"] == "ok" for row in rows), rows
        assert f"{g} mb1" in [row["name"] for row in rows]  # the VARIANTS point, its own row
        peers = [row for row in rows if row.get("tokens_per_s")]
        assert peers and all(row["finite"] and row["tokens_per_s"] > 0 for row in peers)


def test_long_sequence_peers_left_out_are_the_ones_the_planner_says_cannot_fit():
    """Stock TorchTitan on one GPU is the planner's TorchTitan layout (fp32 params, grads, AdamW, bf16 autocast):
    a group leaves its peer out exactly when that estimate does not fit the H200 at the peer's micro batch, which is
    smaller than the preset's only where the preset's would leave it less than the pick's 10% margin."""
    for g in at_scale.GROUPS:
        if g.moe or g.variants:
            continue
        ac = {"none": [], "full": ["recompute.activation_checkpoint_mode=full"]}[g.titan_ac]
        base = ["backend=torchtitan", f"model={g.shape}", "training=bench", "training.compile=true",
                f"training.seq_length={g.seq}", f"model.max_position_embeddings={max(g.seq, 4096)}",
                f"training.global_batch_size={at_scale.bench_batch(g)}"]
        cfg = compose_cfg(base + [f"training.micro_batch_size={g.titan_micro or g.micro}"] + ac)
        assert estimate_memory(cfg, H200, 1).fits == g.titan_fits, g.name
        if g.titan_micro:  # the preset's micro batch would leave it less than the pick's 10% margin
            theirs = estimate_memory(compose_cfg(base + [f"training.micro_batch_size={g.micro}"] + ac), H200, 1)
            assert theirs.needed > 0.9 * theirs.capacity and g.titan_micro < g.micro, g.name


def test_stock_torchtitans_peak_memory_is_the_runs_not_the_last_log_lines():
    """TorchTitan 0.2.2 resets the allocator's peak after each log line (its DeviceMemoryMonitor.reset_peak_stats,
    which the peer script wraps): the peak reported is the largest before any reset, not what followed the last."""
    import runpy

    from torchtitan.components.metrics import DeviceMemoryMonitor

    stock = runpy.run_path(os.path.join(ROOT, "bench", "torchtitan_stock.py"), run_name="bench_torchtitan_stock")
    assert callable(DeviceMemoryMonitor.reset_peak_stats)  # the upstream method the script wraps

    class Monitor:  # an allocator whose peak the monitor resets, as DeviceMemoryMonitor resets torch's
        level = 0

        def reset_peak_stats(self):
            Monitor.level = 5  # what stays allocated after a step: the states

    peak = stock["run_peak"](Monitor, lambda: Monitor.level)
    m = Monitor()
    for step_peak in (60, 62, 61):  # each step's peak, then its log line's reset
        Monitor.level = step_peak
        m.reset_peak_stats()
    assert Monitor.level == 5 and peak() == 62


def test_stock_torchtitan_refuses_offload_in_one_process(capsys):
    """TorchTitan builds the model on the CPU under enable_cpu_offload and moves it with FSDP2 only: one process
    would train on the CPU. The peer script says so before anything starts."""
    import runpy

    argv = sys.argv
    sys.argv = ["torchtitan_stock.py", "--shape", "debug", "--offload"]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(os.path.join(ROOT, "bench", "torchtitan_stock.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--offload" in err and "FSDP2" in err and "Drop --offload" in err


def test_pick_sweep_neighbours_are_valid_and_really_neighbours():
    """Row 4: each variant composes onto the preset and changes the pick in micro batch, offload or recompute."""
    pick_ov = pick(compose_cfg(["experiment=llama2_7b_megatron_fp8_gbs256"]), H200, 1).overrides
    sweep = [g for g in at_scale.GROUPS if g.variants]
    assert sweep and all(g.preset == "llama2_7b_megatron_fp8_gbs256" for g in sweep)
    for g in sweep:
        for label, ov in g.variants:
            cfg = compose_cfg([f"experiment={g.preset}"] + ov.split())
            bd = estimate_memory(cfg, H200, 1)
            assert bd.needed < bd.capacity * 1.05, (label, bd.needed / 2 ** 30)  # each could run on the H200
            assert pick(cfg, H200, 1).overrides == pick_ov  # the planner picks the preset's settings from each


def test_profile_env_profiles_each_groups_megatron_points_once(monkeypatch):
    """PROFILE=1: every group's train.py points (preset, variants, stock megatron-core) profile step 2, the first
    after the compiling step; the peers' scripts are untouched; the preset still validates with it."""
    monkeypatch.setenv("PROFILE", "1")
    prof = "profile.enabled=true profile.start_step=2 profile.steps=1"
    for g in at_scale.GROUPS:
        for flag, spec in at_scale.points(g):
            assert (prof in spec) == (flag == "--extra"), (g.name, spec)
    row1 = next(g for g in at_scale.GROUPS if g.name == "llama2_7b_fp8")
    assert compose_cfg(at_scale.points(row1)[0][1].split("=", 1)[1].split()).profile.enabled
    g = next(g for g in MOE if g.name == "deepseek_v2_lite")
    spec = at_scale.points(g)[0][1].split("=", 1)[1].split()
    cfg = compose_cfg(spec)
    assert cfg.profile.enabled and cfg.profile.start_step == 2 and cfg.training.train_iters >= 2
    monkeypatch.delenv("PROFILE")
    assert not any("profile." in s for _, s in at_scale.points(g))


def test_tables_copy_each_profiled_runs_phase_table(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    for name, profiled in (("prof", True), ("plain", False)):
        (runs / name / "profile").mkdir(parents=True)
        (runs / name / "profile" / "phases_rank0.md").write_text(f"| router | {name} |\n")
        (runs / name / "profile" / "kernels_rank0.md").write_text(f"| gemm | {name} |\n")
    rows = {"deepseek_v2_lite megatron preset": [{"cmd": f"python train.py experiment=x profile.enabled=true "
                                                          f"hydra.run.dir={runs / 'prof'}"}],
            "deepseek_v2_lite megatron-core stock": [{"cmd": f"python train.py hydra.run.dir={runs / 'plain'}"}],
            "deepseek_v2_lite torchtitan stock": [{"cmd": "python bench/torchtitan_stock.py --shape x"}]}
    src = out / "bench_atscale_deepseek_v2_lite_r2_runs.json"
    src.write_text(json.dumps(rows))
    copied = at_scale.copy_profiles(str(src), str(out))
    want = out / "phases_atscale_deepseek_v2_lite_r2_deepseek_v2_lite_megatron_preset.md"
    assert copied == [str(want)] and want.read_text() == "| router | prof |\n"
    assert (out / "kernels_atscale_deepseek_v2_lite_r2_deepseek_v2_lite_megatron_preset.md").read_text() == \
        "| gemm | prof |\n"
    assert sorted(p.name for p in out.glob("phases_*")) == [want.name]


def test_tables_pool_the_runs_at_this_calls_layer_count_apart(tmp_path, monkeypatch):
    """`tables` merges a group's repeats of its own layer count: with LAYERS=5 the 5-layer parts (tag
    atscale_<group>_5layers_r<k>), without it the preset's; never the two in one table."""
    for tag in ("atscale_deepseek_v2_lite_5layers_r1", "atscale_deepseek_v2_lite_5layers_r2",
                "atscale_deepseek_v2_lite_r1"):
        (tmp_path / f"bench_{tag}_runs.json").write_text("{}")
        (tmp_path / f"bench_{tag}.json").write_text("{}")
    merged = {}
    monkeypatch.setattr(at_scale, "run", lambda cmd, out=None: merged.setdefault(cmd[cmd.index("--tag") + 1],
                                                                                cmd[cmd.index("--merge") + 1:]) and 0)
    monkeypatch.setenv("LAYERS", "5")
    at_scale.tables(str(tmp_path))
    assert [os.path.basename(f) for f in merged.pop("atscale_deepseek_v2_lite_5layers")] == [
        "bench_atscale_deepseek_v2_lite_5layers_r1.json", "bench_atscale_deepseek_v2_lite_5layers_r2.json"]
    monkeypatch.delenv("LAYERS")
    at_scale.tables(str(tmp_path))
    assert [os.path.basename(f) for f in merged.pop("atscale_deepseek_v2_lite")] == [
        "bench_atscale_deepseek_v2_lite_r1.json"]
    assert not merged
    # a copy without the _runs.json files (pruned to bring fewer files back) pools the finished parts all the same;
    # a part killed before its table keeps its _runs.json only; repeats sort by number (r10 after r2)
    for f in tmp_path.glob("*_runs.json"):
        f.unlink()
    (tmp_path / "bench_atscale_deepseek_v2_lite_5layers_r10_runs.json").write_text("{}")
    monkeypatch.setenv("LAYERS", "5")
    at_scale.tables(str(tmp_path))
    assert [os.path.basename(f) for f in merged.pop("atscale_deepseek_v2_lite_5layers")] == [
        "bench_atscale_deepseek_v2_lite_5layers_r1.json", "bench_atscale_deepseek_v2_lite_5layers_r2.json",
        "bench_atscale_deepseek_v2_lite_5layers_r10_runs.json"]


def test_bad_knobs_stop_the_script_naming_the_value(monkeypatch):
    monkeypatch.setenv("TIMED_STEPS", "two")
    with pytest.raises(SystemExit, match=r"TIMED_STEPS='two': not allowed; TIMED_STEPS is a whole number >= 1"):
        at_scale.timed_steps()
    monkeypatch.setenv("TIMED_STEPS", "0")
    with pytest.raises(SystemExit, match="TIMED_STEPS='0'"):
        at_scale.timed_steps()
    monkeypatch.setenv("TIMED_STEPS", "1")
    assert at_scale.timed_steps() == 1
    monkeypatch.setenv("DEADLINE_S", "-5")
    with pytest.raises(SystemExit, match=r"DEADLINE_S='-5': not allowed; DEADLINE_S is a number >= 0"):
        at_scale.main(["1"])


def test_points_runs_the_preset_and_the_named_points_only(monkeypatch):
    g = next(g for g in at_scale.GROUPS if g.name == "llama2_7b_fp8")
    monkeypatch.setenv("POINTS", "torchtitan stock")
    names = [spec.split("=", 1)[0] for _, spec in at_scale.points(g)]
    assert names == ["llama2_7b_fp8 megatron preset", "llama2_7b_fp8 torchtitan stock"]
    monkeypatch.setenv("POINTS", "torchtitan stok")
    with pytest.raises(SystemExit, match=r"POINTS='torchtitan stok': 'torchtitan stok' is not a point of "
                                         r"llama2_7b_fp8; its points are 'megatron preset', 'reference', "
                                         r"'torchtitan stock'"):
        at_scale.points(g)


def test_every_point_of_every_group_can_be_named_in_points(monkeypatch):
    """POINTS splits on commas: every point's label is one POINTS entry, which runs the preset and that point."""
    monkeypatch.delenv("POINTS", raising=False)
    for g in at_scale.GROUPS:
        labels = [spec.split("=", 1)[0][len(g.name) + 1:] for _, spec in at_scale.points(g)]
        for label in labels[1:]:
            monkeypatch.setenv("POINTS", label)
            named = [spec.split("=", 1)[0] for _, spec in at_scale.points(g)]
            assert named == [f"{g.name} megatron preset", f"{g.name} {label}"], (g.name, label)
            monkeypatch.delenv("POINTS")
    pick = next(g for g in at_scale.GROUPS if g.name == "llama2_7b_fp8_pick_a")
    monkeypatch.setenv("POINTS", "micro batch 1 + offload 0.5")
    assert "training.micro_batch_size=1 memory.optimizer_offload_fraction=0.5" in at_scale.points(pick)[1][1]


def test_layers_runs_every_moe_point_at_fewer_layers(monkeypatch):
    g = next(g for g in at_scale.GROUPS if g.name == "deepseek_v2_lite")
    monkeypatch.setenv("LAYERS", "5")
    specs = [spec for _, spec in at_scale.points(g)]
    assert "model.num_layers=5" in specs[0] and "model.num_layers=5" in specs[1] and "--layers 5" in specs[2]
    assert not any("--layers 10" in s or "num_layers=10" in s for s in specs)
    monkeypatch.setenv("LAYERS", "11")
    with pytest.raises(SystemExit, match=r"LAYERS=11: more than the 10 layers of deepseek_v2_lite_megatron_fp8"):
        at_scale.points(g)


def test_layers_runs_every_dense_point_and_neighbour_at_fewer_layers(monkeypatch, tmp_path):
    """A dense group's own count is its model's (32); LAYERS=16 reaches the preset, the planner's neighbours and
    both peers, and tags the parts apart."""
    monkeypatch.delenv("POINTS", raising=False)
    monkeypatch.delenv("LAYERS", raising=False)
    row1 = next(g for g in at_scale.GROUPS if g.name == "llama2_7b_fp8")
    pick = next(g for g in at_scale.GROUPS if g.name == "llama2_7b_fp8_pick_a")
    assert at_scale.full_layers(row1) == 32 and not any("layers" in s for _, s in at_scale.points(row1))
    assert at_scale.group_tag(pick) == "atscale_llama2_7b_fp8_pick_a"
    monkeypatch.setenv("LAYERS", "16")
    specs = [spec for _, spec in at_scale.points(row1)]
    assert "model.num_layers=16" in specs[0]
    assert [s.split("=", 1)[0] for s in specs[1:]] == ["llama2_7b_fp8 reference", "llama2_7b_fp8 torchtitan stock"]
    assert all("--shape llama2_7b --layers 16 " in s for s in specs[1:])
    specs = [spec for _, spec in at_scale.points(pick)]
    assert len(specs) == 3 and all("model.num_layers=16" in s for s in specs)
    assert at_scale.group_tag(pick) == "atscale_llama2_7b_fp8_pick_a_16layers"
    merged = {}  # `tables` at LAYERS=16 pools the dense groups' 16-layer parts, past the MoE groups' 10 and 8
    monkeypatch.setattr(at_scale, "run", lambda cmd, out=None: merged.setdefault(cmd[cmd.index("--tag") + 1], 1) and 0)
    tmp = tmp_path / "out"
    tmp.mkdir()
    (tmp / "bench_atscale_llama2_7b_fp8_pick_a_16layers_r1.json").write_text("{}")
    assert at_scale.tables(str(tmp)) == 0 and list(merged) == ["atscale_llama2_7b_fp8_pick_a_16layers"]
    monkeypatch.setenv("LAYERS", "33")
    with pytest.raises(SystemExit, match=r"LAYERS=33: more than the 32 layers of llama2_7b_megatron_fp8_gbs256, "
                                         r"model=llama2_7b's; allowed: 1-32"):
        at_scale.points(row1)


def test_reference_takes_fewer_layers():
    """bench/reference.py --layers builds that many decoder layers of the preset (the row's peer at LAYERS)."""
    spec = importlib.util.spec_from_file_location("bench_reference", os.path.join(ROOT, "bench", "reference.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    assert ref.model_preset("llama2_7b").num_layers == 32
    small = ref.model_preset("llama2_7b", 16)
    assert small.num_layers == 16 and small.hidden_size == 4096


def test_reference_copies_gradients_to_the_host_at_the_last_micro_batch_only():
    """HostCopyGate: a post-accumulate-grad hook registered inside capture() (as torchao's CPUOffloadOptimizer
    registers its host copy) runs at the backward the gate is open for, and sees the gradient accumulated over the
    step's micro batches; outside capture(), and with the gate open, hooks run at every backward as torch runs them."""
    import torch

    spec = importlib.util.spec_from_file_location("bench_reference", os.path.join(ROOT, "bench", "reference.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    model = torch.nn.Linear(4, 3)
    seen, plain = [], []
    gate = ref.HostCopyGate()
    with gate.capture():
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.clone()))
    model.weight.register_post_accumulate_grad_hook(lambda t: plain.append(1))
    xs = torch.randn(3, 2, 4)
    for step in range(2):
        for i, x in enumerate(xs):
            gate.open = i == len(xs) - 1
            model(x).sum().backward()
        model.zero_grad(set_to_none=True)
    assert len(seen) == 2 * 2 and len(plain) == 2 * 3  # 2 params x 2 steps, gated; 3 micro batches x 2, not
    weight_grad = next(g for g in seen[-2:] if g.dim() == 2)
    bias_grad = next(g for g in seen[-2:] if g.dim() == 1)
    assert torch.allclose(weight_grad, xs.sum(dim=(0, 1)).expand(3, 4))  # all 3 micro batches' rows
    assert torch.equal(bias_grad, torch.full((3,), 6.0))
    gate.open = True
    model(xs[0]).sum().backward()
    assert len(seen) == 2 * 2 + 2


def test_reference_refuses_host_copies_without_offload(monkeypatch, capsys):
    """--host-copies says when the offload optimizer copies gradients; without --offload there is none to steer, and
    the run stops before building anything rather than ignore the flag."""
    spec = importlib.util.spec_from_file_location("bench_reference", os.path.join(ROOT, "bench", "reference.py"))
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    monkeypatch.setattr(ref, "model_preset", lambda *a: pytest.fail("built a model before refusing the flag"))
    monkeypatch.setattr(sys, "argv", ["reference.py", "--shape", "debug", "--host-copies", "every"])
    with pytest.raises(SystemExit) as e:
        ref.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--host-copies every" in err and "add --offload" in err


def test_variants_run_the_preset_with_each_variants_overrides_beside_the_peers(monkeypatch):
    """VARIANTS='label:overrides;...': one more megatron point per variant in each group, its own row, kept by POINTS;
    on the DeepSeek-V2-Lite group the preset uncompiled and with fp8 experts compose and validate (a planned H200 run);
    --check runs them as dry runs."""
    from primus.config.validate import validate
    from primus.context import RunContext

    g = next(g for g in MOE if g.name == "deepseek_v2_lite")
    monkeypatch.setenv("VARIANTS", "eager:training.compile=false; fp8experts:turbo.grouped_gemm_fp8=true")
    specs = {spec.split("=", 1)[0]: spec.split("=", 1)[1] for _, spec in at_scale.points(g)}
    assert list(specs)[:3] == ["deepseek_v2_lite megatron preset", "deepseek_v2_lite eager",
                               "deepseek_v2_lite fp8experts"] and "deepseek_v2_lite torchtitan stock" in specs
    for label, compiled, fp8_experts in (("eager", False, False), ("fp8experts", True, True)):  # the preset compiles
        cfg = compose_cfg(specs[f"deepseek_v2_lite {label}"].split())
        assert (cfg.training.compile, cfg.turbo.grouped_gemm_fp8) == (compiled, fp8_experts)
        assert cfg.training.global_batch_size == at_scale.bench_batch(g)
        validate(cfg, RunContext(device="cuda", world_size=1, planned=True))
    monkeypatch.setenv("POINTS", "torchtitan stock")  # the named peer before the variants: a deadline drops those
    assert [spec.split("=", 1)[0] for _, spec in at_scale.points(g)] == [
        "deepseek_v2_lite megatron preset", "deepseek_v2_lite torchtitan stock", "deepseek_v2_lite eager",
        "deepseek_v2_lite fp8experts"]
    checks = [s for f, s in at_scale.points(g, check=True) if s.startswith("deepseek_v2_lite eager=")]
    assert len(checks) == 1 and checks[0].endswith("training.compile=false dry_run=true")
    monkeypatch.delenv("POINTS")
    for bad, why in (("compile", "is not allowed"), ("compile:", "is not allowed"),
                     (":training.compile=true", "is not allowed"), ("com pile:training.compile=true", "not allowed"),
                     ("compile:training.compile", "is not allowed"), ("a:x=1;a:y=2", "given twice"),
                     ("reference:training.compile=true", "is a point of deepseek_v2_lite already")):
        monkeypatch.setenv("VARIANTS", bad)
        with pytest.raises(SystemExit, match=why):
            at_scale.points(g)
    monkeypatch.delenv("VARIANTS")
    assert not any(" eager=" in s for _, s in at_scale.points(g))


def test_point_names_become_plain_file_names():
    """A point's log and run dir are named by bench/e2e.py's _slug: letters, digits, '_', '.', '-' only, so every
    file a part writes is copied back under its name ('+' and spaces are not)."""
    import e2e

    assert e2e._slug("llama2_7b_fp8_pick_a micro batch 1 + offload 0.5") == \
        "llama2_7b_fp8_pick_a_micro_batch_1_offload_0.5"
    assert e2e._slug("stock megatron-core (alltoall)") == "stock_megatron-core_alltoall"
    for g in at_scale.GROUPS:
        for label, _ in g.variants:
            assert all(c.isalnum() or c in "_.-" for c in e2e._slug(f"{g.name} {label}")), label


def test_the_planners_estimate_of_stock_torchtitan_holds_at_8_layers_of_the_long_sequences():
    """Row 3 at 8 layers on an H100 (docs/benchmarks.md): stock TorchTitan with full activation checkpointing
    peaked at 52.9 GiB (seq 16384) and 63.1 GiB (seq 32768); the planner's estimate of its one-GPU layout, the one
    that decides which groups run it, is within 5% below each (10% is the bar)."""
    h100 = resolve_gpu("H100", None)
    for seq, measured in ((16384, 52.9), (32768, 63.1)):
        cfg = compose_cfg(["backend=torchtitan", "model=llama3_8b", "training=bench", "training.compile=true",
                           f"training.seq_length={seq}", f"model.max_position_embeddings={seq}",
                           f"training.global_batch_size={16 * 16384 // seq}", "training.micro_batch_size=1",
                           "recompute.activation_checkpoint_mode=full", "model.num_layers=8"])
        peak = estimate_memory(cfg, h100, 1).total / 2**30
        assert 0.95 * measured < peak <= measured, (seq, peak)


def test_the_planners_estimate_of_stock_torchtitan_without_checkpointing_holds_at_8_layers():
    """Row 3's same-recompute peer at 8 layers on an H100 (docs/benchmarks.md, "Row 3's 10% band"): stock TorchTitan
    with no activation checkpointing peaked at 72.2 GiB (seq 16384, micro batch 1) and 59.1 GiB (seq 4096, micro
    batch 2); the planner's estimate is under each by less than 10% (3.2%, 5.6%), and says both fit the H100."""
    h100 = resolve_gpu("H100", None)
    for seq, micro, gbs, measured in ((16384, 1, 16, 72.2), (4096, 2, 64, 59.1)):
        cfg = compose_cfg(["backend=torchtitan", "model=llama3_8b", "training=bench", "training.compile=true",
                           f"training.seq_length={seq}", f"model.max_position_embeddings={max(seq, 8192)}",
                           f"training.global_batch_size={gbs}", f"training.micro_batch_size={micro}",
                           "model.num_layers=8"])
        est = estimate_memory(cfg, h100, 1)
        assert est.fits and 0.9 * measured < est.total / 2**30 <= measured, (seq, est.total / 2**30)


def test_the_8b_fp8_pick_and_its_peers_estimates_hold_at_8_layers_on_an_h100():
    """Row 1's Llama-3.1-8B fp8 at 8 layers on an H100 (docs/benchmarks.md): the figure measured is the planner's
    pick there (no recompute, no offload, micro batch 2), so a change of pick must come with a new run; the pick and
    the preset peaked at 59.8 and 34.2 GiB, stock TorchTitan (torchao float8) at 45.3 with full checkpointing at
    micro batch 1 and 53.1 with none at micro batch 2: each estimate within 10% of its peak."""
    h100 = resolve_gpu("H100", None)
    preset = ["experiment=llama3_8b_megatron_fp8_gbs256", "model.num_layers=8", "training.global_batch_size=64"]
    chosen = pick(compose_cfg(preset), h100, 1)
    assert chosen.overrides == ["recompute=none", "memory.optimizer_cpu_offload=false",
                                "memory.overlap_cpu_optimizer_d2h_h2d=false", "training.micro_batch_size=2"]
    titan = ["backend=torchtitan", "model=llama3_8b", "precision=fp8", "training=bench", "training.compile=true",
             "training.seq_length=4096", "model.max_position_embeddings=8192", "training.global_batch_size=64",
             "model.num_layers=8"]
    for argv, measured in ((preset, 34.2), (preset + chosen.overrides, 59.8),
                           (titan + ["training.micro_batch_size=1", "recompute.activation_checkpoint_mode=full"], 45.3),
                           (titan + ["training.micro_batch_size=2"], 53.1)):
        est = estimate_memory(compose_cfg(argv), h100, 1).total / 2**30
        assert abs(est - measured) <= 0.10 * measured, (argv, est, measured)


@pytest.mark.e2e
def test_pick_adds_the_planners_pick_for_the_part_as_a_point_unless_the_preset_has_it(monkeypatch):
    """PICK=1: `python -m primus.plan --pick` for the preset as the part runs it, on this machine's GPU (an H200
    here, no GPU): at 5 of DeepSeek-V2-Lite's layers and global batch 64 another micro batch than the preset's,
    its own point, which composes and validates; at Llama-2-7B's full depth and batch the preset is the pick, and
    no point repeats it."""
    from primus.config.validate import validate
    from primus.context import RunContext

    monkeypatch.setenv("PICK", "1")
    monkeypatch.setenv("LAYERS", "5")
    g = next(g for g in MOE if g.name == "deepseek_v2_lite")
    specs = {spec.split("=", 1)[0]: spec.split("=", 1)[1] for _, spec in at_scale.points(g)}
    argv = specs["deepseek_v2_lite pick"].split()
    want = pick(compose_cfg([f"experiment={g.preset}", "model.num_layers=5", "training.global_batch_size=64"]),
                H200, 1).overrides
    assert argv[-len(want):] == want and "training.micro_batch_size=2" not in want
    validate(compose_cfg(argv), RunContext(device="cuda", world_size=1, planned=True))
    monkeypatch.setenv("POINTS", "torchtitan stock")  # kept as a variant is
    assert "deepseek_v2_lite pick" in [spec.split("=", 1)[0] for _, spec in at_scale.points(g)]
    monkeypatch.delenv("POINTS")
    monkeypatch.delenv("LAYERS")
    monkeypatch.setenv("FULL_BATCH", "1")
    dense = next(g for g in DENSE if g.name == "llama2_7b_fp8")
    assert not [s for _, s in at_scale.points(dense) if s.startswith("llama2_7b_fp8 pick=")]
    monkeypatch.setenv("VARIANTS", "pick:training.micro_batch_size=1")
    with pytest.raises(SystemExit, match="is a point of llama2_7b_fp8 already"):
        at_scale.points(dense)


def test_on_off_knobs_refuse_other_values_and_a_failed_pick_stops_the_part(monkeypatch):
    """FULL_BATCH, PROFILE, PICK and ALL_PEERS are 1 or 0 / unset: PICK=true stops the script naming the knob and
    what is allowed, instead of running without the pick. A `--pick` that gives no pick (nothing fits) stops it
    too, with the planner's words, rather than running the part without the point."""
    g = next(g for g in MOE if g.name == "deepseek_v2_lite")
    for knob in ("FULL_BATCH", "PROFILE", "PICK", "ALL_PEERS"):
        monkeypatch.setenv(knob, "true")
        with pytest.raises(SystemExit, match=f"{knob}='true': not allowed; {knob} is 1 \\(on\\) or 0 / unset"):
            at_scale.points(g)
        monkeypatch.setenv(knob, "0")
    assert at_scale.bench_batch(g) == g.global_batch // 4
    monkeypatch.setenv("PICK", "1")
    nothing = subprocess.CompletedProcess([], 1, "", "[primus plan] pick: nothing fits H200 141 GB with 10% free")
    monkeypatch.setattr(at_scale.subprocess, "run", lambda *a, **k: nothing)
    at_scale.pick_overrides.cache_clear()
    with pytest.raises(SystemExit, match="gave no pick:\n.*nothing fits H200"):
        at_scale.points(g)
    at_scale.pick_overrides.cache_clear()


def test_a_pick_with_another_recompute_gets_stock_torchtitan_with_that_recompute_beside_it(monkeypatch):
    """PICK=1: where the pick drops the recompute the group's stock TorchTitan runs (row 3's full), a second peer,
    '<group> torchtitan pick', runs TorchTitan with the pick's recompute and micro batch, so that the pick has the
    issue's same-recompute peer in the same part; a pick that keeps the recompute adds none, and neither does a
    group whose TorchTitan peer does not run (ALL_PEERS unset where it cannot fit an H200)."""
    g = next(g for g in at_scale.GROUPS if g.name == "llama3_8b_seq16k")
    picked = {"ov": "recompute=none memory=offload memory.optimizer_offload_fraction=0.25 "
                    "memory.overlap_cpu_optimizer_d2h_h2d=true training.micro_batch_size=1"}
    monkeypatch.setattr(at_scale, "pick_overrides", lambda preset, ov: picked["ov"])
    monkeypatch.setenv("PICK", "1")
    monkeypatch.setenv("LAYERS", "8")
    assert not [s for _, s in at_scale.points(g) if "torchtitan" in s]  # it cannot fit: no peer, no pick peer
    monkeypatch.setenv("ALL_PEERS", "1")
    specs = {s.split("=", 1)[0]: s.split("=", 1)[1] for _, s in at_scale.points(g)}
    assert "--ac full" in specs["llama3_8b_seq16k torchtitan stock"]
    theirs = specs["llama3_8b_seq16k torchtitan pick"].split()
    assert theirs[theirs.index("--ac") + 1] == "none" and theirs[theirs.index("--batch") + 1] == "1"
    assert theirs[theirs.index("--seq") + 1] == "16384" and theirs[theirs.index("--layers") + 1] == "8"
    monkeypatch.setenv("POINTS", "torchtitan pick")  # named, it runs; the pick runs with it as PICK asks
    assert [s.split("=", 1)[0] for _, s in at_scale.points(g)] == [
        "llama3_8b_seq16k megatron preset", "llama3_8b_seq16k torchtitan pick", "llama3_8b_seq16k pick"]
    monkeypatch.delenv("POINTS")
    picked["ov"] = "recompute=selective memory.optimizer_cpu_offload=false training.micro_batch_size=2"
    specs = [s for _, s in at_scale.points(g) if s.startswith("llama3_8b_seq16k torchtitan pick=")]
    assert len(specs) == 1 and "--ac selective" in specs[0] and "--batch 2 " in specs[0]
    picked["ov"] = "recompute=full memory.optimizer_cpu_offload=false training.micro_batch_size=1"
    assert not [s for _, s in at_scale.points(g) if s.startswith("llama3_8b_seq16k torchtitan pick=")]
