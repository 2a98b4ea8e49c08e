"""Performance where users train, on one GPU: every row of the at-scale table with its peers, in parts under 9 min.

Rows (each a preset of conf/experiment/ and the peers it is measured beside, same shape, same micro batch):
  1. Llama-2-7B and the Llama-3.1-8B shape, fp8 and bf16, seq 4096: the megatron preset, the plain-PyTorch
     reference (bench/reference.py: compiled, torchao float8 for fp8, torchao's CPUOffloadOptimizer, gradient
     accumulation) and stock TorchTitan (bench/torchtitan_stock.py: compile, float8 for fp8; its CPU offload needs
     FSDP over several GPUs, so on one GPU it runs without, and at 8B with full activation checkpointing to fit).
  2. The DeepSeek-V2-Lite and Qwen3-30B-A3B layer shapes (10 and 8 layers: the planner's most without offload):
     the megatron preset, stock megatron-core (STOCK_MEGATRON) and stock TorchTitan's MoE at the same shape.
  3. The Llama-3.1-8B shape at seq 16384 and 32768: the megatron preset (stock TorchTitan with the same full
     recompute does not fit one H200 there: ALL_PEERS=1 runs it anyway).
  4. The planner's pick against a small sweep: the Llama-2-7B fp8 preset beside four neighbours of its micro batch,
     offload share and recompute (two groups).

Each group runs in 3 parts, one repeat of all its points each (A B C; A B C; A B C: interleaved), so that a part
stays under 9 minutes; `tables` pools the repeats of each group into its table (medians, min-max), with the
planner's estimate beside each megatron run's measured peak. The bench runs each group at a quarter of its
preset's global batch (seq 4096: 64), 1 untimed step (compilation) + 2 timed: the same micro batch and the same
per-micro-batch work, with the offloaded optimizer step spread over 4x fewer tokens than the preset's (a floor for
the preset's tokens/s); FULL_BATCH=1 runs the presets' own global batch (about 4x the time: split the part).
TIMED_STEPS=1 times one step instead of two (a 7B group's three points then fit one part on an H200); DEADLINE_S sets
the part's deadline (default 480 s): a point the pace so far says would end after it is not started.
LAYERS=5 runs the groups' points at fewer layers (a GPU smaller than an H200), tagged apart. POINTS='torchtitan
stock' runs the preset and the named points of the group only (comma-separated labels, as `list` prints them after
the group's name). PROFILE=1 profiles each group's train.py points (the preset, its variants, stock megatron-core)
for one step, the first after the compiling step (`profile.enabled=true profile.start_step=2 profile.steps=1`; that step
stays timed: the profiler costs about 0.2% of a step on the H200, docs/benchmarks.md), and `tables` (which each part
runs at its end) copies each profiled run's tables into $OUT: phases_<part tag>_<point>.md, the step by phase
(router, dispatch/permute, experts, combine/unpermute, shared experts, attention, dense MLP, gradient accumulation,
optimizer, other), and kernels_<part tag>_<point>.md, the kernel categories. VARIANTS adds to each group of the
call one megatron point per variant, the preset with the variant's overrides, in its own row ('<group> <label>')
beside the preset and the peers (POINTS keeps them): the DeepSeek-V2-Lite preset, stock TorchTitan, the preset
uncompiled and with fp8 experts in one part:

    POINTS='torchtitan stock' VARIANTS='eager:training.compile=false;fp8experts:turbo.grouped_gemm_fp8=true' \
        bash bench/at_scale.sh 13

PICK=1 adds one more, '<group> pick': the preset with the overrides `python -m primus.plan --pick` gives for it as
the part runs it (its layers and global batch) on this machine's GPU, unless the preset has those settings already
(at fewer layers or on a smaller GPU the pick is often another micro batch or offload share than the preset's).
Where the pick's recompute is not the one the group's stock TorchTitan runs, and that peer runs, a second
TorchTitan peer, '<group> torchtitan pick', runs with the pick's recompute and micro batch (the issue's peer runs
the same recompute):

    LAYERS=5 PICK=1 POINTS='megatron preset' bash bench/at_scale.sh 13

    bash bench/at_scale.sh list          # the parts and their points
    bash bench/at_scale.sh 1             # part 1 (GPU), tables to $OUT
    bash bench/at_scale.sh 1-3,13        # parts 1, 2, 3 and 13, one after another
    bash bench/at_scale.sh all           # every row of the issue at once (about 3.5 h on an H200, no deadline)
    bash bench/at_scale.sh tables        # pool every part's runs found in $OUT into one table per group
    bash bench/at_scale.sh --check       # every entry at the debug shape on this CPU (train.py points: dry runs)
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
REPEATS = 3

# megatron-core as it ships, through train.py: its local spec (no Transformer Engine), its alltoall dispatcher, its
# SequentialMLP experts (no grouped GEMM, no permute fusion), bf16, none of the project's kernels or fusions (turbo
# off, megatron's RoPE and SwiGLU unfused as its TransformerConfig defaults, its own vocab-parallel cross entropy
# uncompiled), the optimizer on the GPU
STOCK_MEGATRON = ("backend=megatron backend.layer_spec=local turbo=off moe=off moe.moe_token_dispatcher_type=alltoall "
                  "model.apply_rope_fusion=false model.bias_activation_fusion=false "
                  "model.cross_entropy_loss_fusion=false training.compile=false precision=bf16 memory=default")


@dataclass
class Group:
    name: str
    row: int
    preset: str  # conf/experiment/<preset>.yaml
    shape: str  # conf/model/<shape>.yaml
    seq: int
    global_batch: int  # the preset's
    layers: int = 0  # MoE: the preset's layer count (0: the model's)
    micro: int = 1  # the preset's micro batch, which the peers run too
    # stock TorchTitan's micro batch where at the preset's its estimate leaves less than the pick's 10% margin with
    # its recompute (0: the preset's): it runs the same global batch in more, smaller micro batches
    titan_micro: int = 0
    fp8: bool = False
    moe: bool = False
    titan_ac: str = "none"  # stock TorchTitan's activation checkpointing (row 3: the preset's full recompute)
    # whether stock TorchTitan can hold the model on one H200 (the planner's estimate of its one-GPU layout: fp32
    # params, grads and AdamW, bf16 autocast); a peer that cannot is left out of the parts (ALL_PEERS=1 runs it)
    titan_fits: bool = True
    # row 4, the planner's pick against its neighbours: (label, overrides on the preset), measured beside it
    variants: List[Tuple[str, str]] = field(default_factory=list)
    reference: bool = True
    points: List[Tuple[str, List[str]]] = field(default_factory=list)


GROUPS = [
    # stock TorchTitan at the preset's micro batch 2 plans 147.9 GiB (7B, no checkpointing) and 135.1 (8B, full)
    Group("llama2_7b_fp8", 1, "llama2_7b_megatron_fp8_gbs256", "llama2_7b", 4096, 256, micro=2, titan_micro=1,
          fp8=True),
    Group("llama2_7b_bf16", 1, "llama2_7b_megatron_bf16_gbs256", "llama2_7b", 4096, 256, micro=2, titan_micro=1),
    # stock TorchTitan keeps fp32 params, grads and AdamW on one GPU (16 B a param: 120 GiB at 8B; its CPU offload
    # needs FSDP over several GPUs): at 8B it fits only with full activation checkpointing
    Group("llama3_8b_fp8", 1, "llama3_8b_megatron_fp8_gbs256", "llama3_8b", 4096, 256, fp8=True, titan_ac="full"),
    Group("llama3_8b_bf16", 1, "llama3_8b_megatron_bf16_gbs256", "llama3_8b", 4096, 256, micro=2, titan_micro=1,
          titan_ac="full"),
    Group("deepseek_v2_lite", 2, "deepseek_v2_lite_megatron_fp8", "deepseek_v2_lite", 4096, 256, layers=10, micro=2,
          fp8=True, moe=True, reference=False),
    Group("qwen3_30b_a3b", 2, "qwen3_30b_a3b_megatron_fp8", "qwen3_30b_a3b", 4096, 256, layers=8, micro=2, fp8=True,
          moe=True, reference=False),
    # at 8B and seq 16k / 32k stock TorchTitan on one GPU plans 143.7 / 160.7 GiB of 139.8 even with full AC (its
    # 120 GiB of fp32 state plus the compiled loss's 4 B per logit): the bench does not start a run that cannot fit
    Group("llama3_8b_seq16k", 3, "llama3_8b_megatron_bf16_seq16k", "llama3_8b", 16384, 64, titan_ac="full",
          reference=False, titan_fits=False),
    Group("llama3_8b_seq32k", 3, "llama3_8b_megatron_bf16_seq32k", "llama3_8b", 32768, 32, titan_ac="full",
          reference=False, titan_fits=False),
    # the preset (micro batch 2, three quarters of Adam offloaded, no recompute: the pick) against the order's first
    # fit (micro batch 1, half offloaded), all of Adam offloaded (the pick while the estimate counted the fused QKV
    # output as SDPA's v), and the two recomputes
    Group("llama2_7b_fp8_pick_a", 4, "llama2_7b_megatron_fp8_gbs256", "llama2_7b", 4096, 256, micro=2, fp8=True,
          reference=False, titan_fits=False,
          variants=[("micro batch 1 + offload 0.5",
                     "training.micro_batch_size=1 memory.optimizer_offload_fraction=0.5"),
                    ("offload 1.0", "memory.optimizer_offload_fraction=1.0")]),
    Group("llama2_7b_fp8_pick_b", 4, "llama2_7b_megatron_fp8_gbs256", "llama2_7b", 4096, 256, micro=2, fp8=True,
          reference=False, titan_fits=False,
          variants=[("selective recompute", "recompute=selective"),
                    ("full recompute + micro batch 4", "recompute=full training.micro_batch_size=4")]),
]


def env_number(name: str, default: str, cast, least: float):
    """An environment knob of this script, checked: a value that is not a number >= `least` stops the script."""
    raw = os.environ.get(name, default)
    try:
        value = cast(raw)
    except ValueError:
        value = None
    if value is None or value < least:
        kind = "whole number" if cast is int else "number"
        sys.exit(f"[at_scale] {name}={raw!r}: not allowed; {name} is a {kind} >= {least} (unset: {default})")
    return value


def env_flag(name: str) -> bool:
    """An on/off knob of this script (FULL_BATCH, PROFILE, PICK, ALL_PEERS): 1 on, 0 or unset off; any other value
    stops the script rather than leave it off."""
    raw = os.environ.get(name, "").strip()
    if raw not in ("", "0", "1"):
        sys.exit(f"[at_scale] {name}={raw!r}: not allowed; {name} is 1 (on) or 0 / unset (off)")
    return raw == "1"


def timed_steps() -> int:
    """Timed steps per run after the one compiling step (TIMED_STEPS, default 2; 1 fits a 7B group's three points
    in one part on an H200)."""
    return env_number("TIMED_STEPS", "2", int, 1)


def profile_overrides(g: Group) -> str:
    """PROFILE=1: the profiler over the first step after the compiling one, on a group's megatron points."""
    if not env_flag("PROFILE"):
        return ""
    return " profile.enabled=true profile.start_step=2 profile.steps=1"


def full_layers(g: Group) -> int:
    """The group's own layer count: the MoE preset's (the most that fit an H200), else its model's."""
    if g.layers:
        return g.layers
    from omegaconf import OmegaConf

    return int(OmegaConf.load(os.path.join(ROOT, "conf", "model", f"{g.shape}.yaml")).num_layers)


def group_layers(g: Group) -> int:
    """The layer count the group's points run at: its own, or LAYERS (fewer, for a GPU smaller than an H200: 5 of
    DeepSeek-V2-Lite's fit an H100's 80 GB with the preset's settings; at 16 of Llama-2-7B's the planner's pick for
    an H100 is row 1's for an H200, `python -m primus.plan --pick ... plan.gpu=H100`)."""
    full = full_layers(g)
    n = env_number("LAYERS", str(full), int, 1)
    if n > full:
        what = "the most that fit an H200" if g.layers else f"model={g.shape}'s"
        sys.exit(f"[at_scale] LAYERS={n}: more than the {full} layers of {g.preset}, {what}; allowed: 1-{full}")
    return n


VARIANT_LABEL = re.compile(r"[A-Za-z0-9_.+-]+")
VARIANTS_EXAMPLE = "VARIANTS='compile:training.compile=true;fp8experts:turbo.grouped_gemm_fp8=true'"


def variants() -> List[Tuple[str, str]]:
    """VARIANTS: [(label, train.py overrides)], each a megatron point of every group run (the preset with them)."""
    raw = os.environ.get("VARIANTS", "").strip()
    out: List[Tuple[str, str]] = []
    for piece in (p.strip() for p in raw.split(";")):
        if not piece:
            continue
        label, sep, ov = (x.strip() for x in piece.partition(":"))
        if not (sep and VARIANT_LABEL.fullmatch(label) and ov and all("=" in o for o in ov.split())):
            sys.exit(f"[at_scale] VARIANTS={raw!r}: {piece!r} is not allowed; a variant is LABEL:OVERRIDES (a label "
                     "of letters, digits and _.+-, then train.py overrides key=value separated by spaces), variants "
                     f"separated by ';', e.g. {VARIANTS_EXAMPLE}")
        if label in [l for l, _ in out]:
            sys.exit(f"[at_scale] VARIANTS={raw!r}: the label {label!r} is given twice; give each variant its own")
        out.append((label, ov))
    return out


def bench_batch(g: Group) -> int:
    return g.global_batch if env_flag("FULL_BATCH") else max(1, g.global_batch // 4)


def points(g: Group, check: bool = False) -> List[Tuple[str, List[str]]]:
    """The group's points as bench/e2e.py arguments: ('--extra'|'--peer', 'NAME=ARGV'). `check`: train.py points
    as dry runs of the same command, the peers at the debug shape on a CPU (eager, no offload)."""
    gbs = bench_batch(g)
    n = timed_steps()
    steps = f"training.train_iters={n + 1} training.timing_warmup_steps=1 training.lr_warmup_iters=1"
    steps += profile_overrides(g)
    batch = f"training.global_batch_size={gbs}"
    out = []
    dry = " dry_run=true" if check else ""
    layers = group_layers(g)
    fewer = f" model.num_layers={layers}" if layers != full_layers(g) else ""
    out.append(("--extra", f"{g.name} megatron preset=experiment={g.preset}{fewer} {batch} {steps}{dry}"))
    for label, ov in g.variants:
        out.append(("--extra", f"{g.name} {label}=experiment={g.preset}{fewer} {ov} {batch} {steps}{dry}"))
    taken = {"megatron preset", "megatron-core stock", "reference", "torchtitan stock", *(l for l, _ in g.variants)}
    taken |= {"pick"} if env_flag("PICK") else set()
    for label, ov in variants():  # the variant's overrides last: they win over the bench's batch and steps
        if label in taken:
            sys.exit(f"[at_scale] VARIANTS: the label {label!r} is a point of {g.name} already; pick another")
        out.append(("--extra", f"{g.name} {label}=experiment={g.preset}{fewer} {batch} {steps} {ov}{dry}"))
    picked = pick_overrides(g.preset, f"{fewer} {batch}") if env_flag("PICK") else None
    if picked:
        out.append(("--extra", f"{g.name} pick=experiment={g.preset}{fewer} {batch} {steps} {picked}{dry}"))
    if g.moe:
        out.append(("--extra", f"{g.name} megatron-core stock={STOCK_MEGATRON} model={g.shape} model.num_layers="
                               f"{layers} training=bench training.micro_batch_size={g.micro} {batch} {steps}{dry}"))
    if check:  # the peers themselves, small enough for a CPU
        shape = "debug_moe" if g.moe else "debug"
        size = lambda micro: "--seq 64 --batch 2 --global-batch 4 --steps 1 --warmup 1"  # noqa: E731
    else:
        shape = g.shape + (f" --layers {layers}" if g.layers or fewer else "")
        size = lambda micro: f"--seq {g.seq} --batch {micro} --global-batch {gbs} --steps {n} --warmup 1"  # noqa: E731
    # torchao makes the peers' float8; a CPU check without it checks their bf16 path (the GPU machine has it)
    fp8 = g.fp8 and (not check or importlib.util.find_spec("torchao") is not None)
    if g.reference:
        variant = "float8" if fp8 else "compile_fused"
        ref = f"bench/reference.py --shape {shape} --variant {variant} {size(g.micro)}"
        ref += " --no-compile" if check else " --offload"
        out.append(("--peer", f"{g.name} reference={ref}"))
    # (no --offload: TorchTitan offloads through FSDP2 only, which one GPU does not use)
    titan = lambda micro, ac: (f"bench/torchtitan_stock.py --shape {shape} {size(micro)} --ac {ac}"  # noqa: E731
                               + (" --float8" if fp8 else "") + ("" if check else " --compile"))
    all_peers = env_flag("ALL_PEERS")  # read (and checked) on every group, whether it needs it or not
    if not g.variants and (g.titan_fits or check or all_peers):
        out.append(("--peer", f"{g.name} torchtitan stock={titan(g.titan_micro or g.micro, g.titan_ac)}"))
        same = titan_like_pick(g, picked)
        if same:
            out.append(("--peer", f"{g.name} torchtitan pick={titan(*same)}"))
    return only_points(g, out)


PICK_RECOMPUTE = re.compile(r"(?:^|\s)recompute=(none|selective|full)(?:\s|$)")
PICK_MICRO = re.compile(r"(?:^|\s)training\.micro_batch_size=(\d+)(?:\s|$)")


def titan_like_pick(g: Group, picked) -> Optional[Tuple[int, str]]:
    """Stock TorchTitan's (micro batch, activation checkpointing) beside a pick whose recompute is not the one the
    group's TorchTitan peer runs (the issue's peer runs the same recompute): megatron's none / selective (core
    attention) / full as TorchTitan's none / selective / full, at the pick's micro batch. None where the pick keeps
    the group's recompute: the group's peer is that one already."""
    m = PICK_RECOMPUTE.search(picked or "")
    if not m or m.group(1) == g.titan_ac:
        return None
    micro = PICK_MICRO.search(picked)
    return (int(micro.group(1)) if micro else g.micro), m.group(1)


@functools.lru_cache(maxsize=None)
def pick_overrides(preset: str, overrides: str) -> str:
    """PICK=1: `python -m primus.plan --pick` for the preset as a group's points run it (layers, global batch) on
    this machine's GPU (plan.gpu=auto: an H200 where there is none): its overrides, a megatron point of their own
    beside the preset; '' where the preset has those settings already (no point: it would repeat the preset).
    Asked once per preset and overrides (`list` and a part's command ask for every repeat)."""
    cmd = [PY, "-m", "primus.plan", "--pick", f"experiment={preset}", *overrides.split(), "plan.gpu=auto"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = [line.strip() for line in r.stdout.splitlines()]
    got = [line[len("overrides: "):] for line in lines if line.startswith("overrides: ")]
    if r.returncode != 0 or not got:
        sys.exit(f"[at_scale] PICK=1: {' '.join(cmd[1:])} gave no pick:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    if "the config has these settings already" in lines:
        print(f"[at_scale] PICK=1: {preset}: has the pick's settings already ({got[0]}): no pick point",
              flush=True)
        return ""
    return got[0]


def only_points(g: Group, pts: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """POINTS='torchtitan stock,...': the preset (every ratio's baseline), these of the group's other points in the
    order given, then the VARIANTS, e.g. FULL_BATCH=1 without the reference, whose 4x longer run would not fit a
    part. The named points run before the variants so that a part's deadline drops a variant, not the peer."""
    raw = os.environ.get("POINTS", "").strip()
    if not raw:
        return pts
    label = lambda spec: spec.split("=", 1)[0][len(g.name) + 1:]
    asked = {l for l, _ in variants()} | ({"pick", "torchtitan pick"} if env_flag("PICK") else set())
    wanted = [w.strip() for w in raw.split(",") if w.strip()]
    known = [label(s) for _, s in pts]
    bad = [w for w in wanted if w not in known]
    if bad:
        sys.exit(f"[at_scale] POINTS={raw!r}: {', '.join(map(repr, bad))} is not a point of {g.name}; its points are "
                 f"{', '.join(map(repr, known))} (the preset always runs)")
    by = {label(s): (f, s) for f, s in pts}
    return ([by["megatron preset"]] + [by[w] for w in wanted if w != "megatron preset"]
            + [(f, s) for f, s in pts if label(s) in asked and label(s) not in wanted])


def parts() -> List[Tuple[Group, int]]:
    """Part k (1-based): a group's repeat r, each group's repeats in consecutive parts."""
    return [(g, r) for g in GROUPS for r in range(1, REPEATS + 1)]


def e2e_cmd(g: Group, tag: str, check: bool, timeout: int, deadline: float) -> List[str]:
    cmd = [PY, "bench/e2e.py", "--suite", "none", "--repeats", "1", "--tag", tag, "--timeout", str(timeout),
           "--ref", f"{g.name} megatron preset"]
    if deadline:
        cmd += ["--deadline-s", str(deadline)]
    for flag, spec in points(g, check):
        cmd += [flag, spec]
    return cmd


def run(cmd: List[str], out: str = "") -> int:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env={**os.environ, **({"OUT": out} if out else {})})


def copy_profiles(runs_json: str, out: str) -> List[str]:
    """The phase and kernel tables of each profiled train.py run of a part, copied into `out` (the run dirs stay on
    the measuring machine): phases_<tag>_<point>.md, kernels_<tag>_<point>.md. Returns the phase tables copied."""
    tag = os.path.basename(runs_json)[len("bench_"): -len("_runs.json")]
    with open(runs_json) as f:
        runs = json.load(f)
    copied = []
    for name, rows in runs.items():
        for row in rows:
            cmd = shlex.split(row.get("cmd", ""))
            run_dir = next((c.split("=", 1)[1] for c in cmd if c.startswith("hydra.run.dir=")), None)
            if "profile.enabled=true" not in cmd or run_dir is None:
                continue
            point = re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).strip("_")
            for kind in ("phases", "kernels"):
                src = os.path.join(run_dir, "profile", f"{kind}_rank0.md")
                if os.path.exists(src):
                    dst = os.path.join(out, f"{kind}_{tag}_{point}.md")
                    shutil.copyfile(src, dst)
                    if kind == "phases":
                        copied.append(dst)
                        with open(dst) as f:
                            print(f"[at_scale] {name}: step by phase ({dst})\n{f.read()}", flush=True)
    return copied


def group_tag(g: Group) -> str:
    """The tag of a group's parts, without the repeat: a run at fewer layers (LAYERS) is another group's, tagged and
    pooled apart from the preset's."""
    n = group_layers(g)
    return f"atscale_{g.name}" + (f"_{n}layers" if n != full_layers(g) else "")


def tables(out: str) -> int:
    """Pools each group's parts found in `out` (at this call's LAYERS) into one table."""
    rc = 0
    for g in GROUPS:
        if env_number("LAYERS", "0", int, 0) > full_layers(g):
            continue  # no part of this group runs at more layers than its own
        # a finished part's bench_<tag>_r<k>.json carries the measuring machine's versions; a killed part left only
        # its runs (_runs.json, which also name the profiled run dirs); either may have been pruned from a copy
        files = []
        tag = group_tag(g)
        repeats = {}
        for path in glob.glob(os.path.join(out, f"bench_{tag}_r*.json")):
            m = re.fullmatch(rf"bench_{re.escape(tag)}_r(\d+)(_runs)?\.json", os.path.basename(path))
            if m:
                repeats.setdefault(int(m.group(1)), {})["runs" if m.group(2) else "full"] = path
        for k in sorted(repeats):
            found = repeats[k]
            if "runs" in found:
                copy_profiles(found["runs"], out)
            files.append(found.get("full") or found["runs"])
        if files:
            rc |= run([PY, "bench/e2e.py", "--tag", tag, "--ref", f"{g.name} megatron preset",
                       "--merge", *files], out)
        else:
            ks = ", ".join(str(i + 1) for i, (h, _) in enumerate(parts()) if h is g)
            print(f"[at_scale] {g.name}: no runs in {out} yet (parts {ks})")
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", default="list",
                    help="a part number, several ('1-3,13'), 'all' (every row, one after another), 'list' or 'tables'")
    ap.add_argument("--check", action="store_true", help="every group's entries on this CPU, at the debug shape")
    ap.add_argument("--only", nargs="*", help="with --check: these groups only")
    args = ap.parse_args(argv)
    out = os.environ.get("OUT") or os.path.join(ROOT, "outputs", "bench")
    os.makedirs(out, exist_ok=True)
    if args.check:
        sys.path.insert(0, ROOT)
        from primus.context import gpu_present  # imports no torch (seconds) where no GPU device is present

        if gpu_present():
            print("[at_scale] --check is the CPU check; on a GPU run the parts", file=sys.stderr)
            return 2
        names = {g.name for g in GROUPS}
        bad = [n for n in (args.only or []) if n not in names]
        if bad:
            ap.error(f"--only {' '.join(bad)}: not a group; the groups are {', '.join(sorted(names))}")
        rc = 0
        for g in GROUPS:
            if args.only and g.name not in args.only:
                continue
            tag = f"atscale_check_{g.name}"
            rc |= run(e2e_cmd(g, tag, True, 900, 0), out)
            with open(os.path.join(out, f"bench_{tag}.json")) as f:
                failed = [r["name"] for r in json.load(f)["rows"] if r.get("status") != "ok"]
            if failed:
                print(f"[at_scale] check failed: {', '.join(failed)}", file=sys.stderr)
                rc |= 1
        return rc
    if args.what == "list":
        for i, (g, r) in enumerate(parts(), 1):
            try:  # a LAYERS that one group cannot take stops that group's parts, not the listing
                what = "; ".join(s.split("=", 1)[0] for _, s in points(g))
            except SystemExit as e:
                what = f"cannot run: {e.code}"
            print(f"part {i}: row {g.row}, {g.name}, repeat {r}/{REPEATS}, global batch {bench_batch(g)} "
                  f"(preset {g.global_batch}): {what}")
        return 0
    if args.what == "tables":
        return tables(out)
    ks = part_numbers(args.what)
    if ks is None:
        ap.error(f"{args.what!r}: a part 1-{len(parts())}, a list of them ('1-3,13'), 'all', 'list' or 'tables'")
    # DEADLINE_S: start no point that the part's pace says would end after it (default 8 min, a part per call of a
    # machine that limits calls; 'all' has none unless set)
    deadline = env_number("DEADLINE_S", "0" if args.what == "all" else "480", float, 0)
    rc = 0
    for k in ks:
        g, r = parts()[k - 1]
        print(f"[at_scale] part {k} of {len(parts())}: {g.name}, repeat {r}/{REPEATS}", flush=True)
        tag = f"{group_tag(g)}_r{r}"
        rc |= run(e2e_cmd(g, tag, False, 420, deadline), out)
    tables(out)
    return rc


def part_numbers(spec: str):
    """'all', '7', '1-3,13' -> the part numbers in order (None if the spec names no valid part)."""
    n = len(parts())
    if spec == "all":
        return list(range(1, n + 1))
    out = []
    try:
        for piece in spec.split(","):
            lo, _, hi = piece.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        return None
    return out if out and all(1 <= k <= n for k in out) else None

if __name__ == "__main__":
    sys.exit(main())
