"""End-to-end benchmark: the plain-PyTorch reference and this framework's backends, same model, one GPU, one command.

    python bench/e2e.py --suite core          # reference (compile+fused, float8) + both backends bf16/fp8
    python bench/e2e.py --suite presets       # the README's performance table: references + the experiment presets
    python bench/e2e.py --suite core --append results.md

Each point runs in its own process (clean memory) with a time limit; a failed point is a row with its error. The
points run `--repeats` times (default 3), interleaved (A B C, A B C, ...), so that a drift of the machine touches
every point alike; each figure is the median of its repeats, with the min-max beside it. Prints a markdown table of
tokens/s, TFLOP/s/GPU, MFU under three conventions (attention not causal-halved, on the bf16 peak: the README's; the
same with causal-halved attention; on the fp8 peak), peak memory and the ratio of medians to the reference measured
in the same run, and writes it (with date, commit, GPU, versions and commands) to $OUT or --append.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

QUIET = ["logging.tensorboard=false", "plan.enforce=false"]
BENCH = ["model=llama3_2_1b", "training=bench", *QUIET]

SUITES = {
    "core": [
        ("reference/compile_fused", ["bench/reference.py", "--variant", "compile_fused"]),
        ("reference/float8", ["bench/reference.py", "--variant", "float8"]),
        ("megatron bf16", ["train.py", "backend=megatron", *BENCH]),
        ("megatron fp8", ["train.py", "backend=megatron", "precision=fp8", *BENCH]),
        ("torchtitan bf16 compile", ["train.py", "backend=torchtitan", "training.compile=true", *BENCH]),
        ("torchtitan fp8 compile", ["train.py", "backend=torchtitan", "training.compile=true", "precision=fp8", *BENCH]),
    ],
    # the README's performance table: the references and the Llama-3.2-1B experiment presets, in one run
    "presets": [
        ("reference/compile_fused", ["bench/reference.py", "--variant", "compile_fused"]),
        ("reference/float8", ["bench/reference.py", "--variant", "float8"]),
        ("megatron bf16 preset", ["train.py", *QUIET, "experiment=llama3_2_1b_megatron_bf16"]),
        ("megatron fp8 preset", ["train.py", *QUIET, "experiment=llama3_2_1b_megatron_fp8"]),
        ("megatron fp8 delayed preset", ["train.py", *QUIET, "experiment=llama3_2_1b_megatron_fp8_delayed"]),
        ("torchtitan bf16 preset", ["train.py", *QUIET, "experiment=llama3_2_1b_torchtitan_bf16"]),
    ],
    "none": [],  # only the --extra points
    "reference": [
        ("reference/eager", ["bench/reference.py", "--variant", "eager"]),
        ("reference/compile_fused", ["bench/reference.py", "--variant", "compile_fused"]),
        ("reference/float8", ["bench/reference.py", "--variant", "float8"]),
    ],
}


def _slug(name: str) -> str:
    """A point's name as a path part Hydra accepts in hydra.run.dir and that file copies keep as it is: letters,
    digits, '_', '.', '-' ('micro batch 1 + offload 0.5' -> 'micro_batch_1_offload_0.5')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")


def run_point(name, argv, timeout, log_dir, rep=0):
    cmd = [PY] + argv
    t0 = time.time()
    run_dir = None
    if argv[0] == "train.py":
        run_dir = os.path.join(ROOT, "outputs", "bench", _slug(name) + (f"-r{rep}" if rep else ""))
        cmd += [f"hydra.run.dir={run_dir}"]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    if log_dir:
        with open(os.path.join(log_dir, _slug(name) + (f"-r{rep}" if rep else "") + ".log"), "w") as f:
            f.write(" ".join(shlex.quote(c) for c in cmd) + "\n" + out)
    row = {"name": name, "cmd": " ".join(shlex.quote(c) for c in [os.path.basename(PY)] + cmd[1:]), "rc": rc,
           "wall_s": time.time() - t0}
    if "dry_run=true" in argv:  # a check of the command: validation and backend arguments, no training
        row.update(status="ok" if rc == 0 else "failed", error=None if rc == 0 else (out.strip().splitlines() or
                                                                                     [f"rc={rc}"])[-1][:300])
    elif run_dir and os.path.exists(os.path.join(run_dir, "result.json")):
        with open(os.path.join(run_dir, "result.json")) as f:
            res = json.load(f)
        row.update(status=res.get("status"), tokens_per_s=res.get("tokens_per_s"),
                   tflops_per_gpu=res.get("tflops_per_gpu"), mfu=res.get("mfu"), mfu_causal=res.get("mfu_causal"),
                   mfu_fp8_peak=res.get("mfu_fp8_peak"),
                   peak_memory_gib=(res.get("memory") or {}).get("max_allocated_gib", res.get("peak_memory_gib")),
                   step_time_s=(res.get("step_time_s") or {}).get("median"), step_split_s=res.get("step_split_s"),
                   optimizer_split_s=res.get("optimizer_split_s"), error=res.get("error"),
                   backend_info=res.get("backend_info"), planned_gib=planned_gib(res))
    else:
        for line in reversed(out.splitlines()):
            if line.startswith("{") and '"tokens_per_s"' in line:
                got = json.loads(line)
                got["impl"] = got.pop("name", None)  # the script's own label; the row keeps the point's name
                row.update(got, status="ok")
                break
        else:
            row.update(status="failed", error=out.strip().splitlines()[-1][:300] if out.strip() else f"rc={rc}")
    return row


def planned_gib(result):
    """The planner's peak estimate for a finished run (primus.plan.compare), beside its measured peak."""
    try:
        from primus.plan.compare import row

        return row(result)["estimate_gib"]
    except Exception:  # noqa: BLE001 - a run whose config the planner cannot read still gets its row
        return None


def combine(runs):
    """One row per point from its repeats: the figures of the median run, with the min-max of tokens/s."""
    ok = [r for r in runs if r.get("status") == "ok" and r.get("tokens_per_s")]
    if not ok:
        return dict(runs[-1], repeats=len(runs), ok_repeats=0)
    ok.sort(key=lambda r: r["tokens_per_s"])
    row = dict(ok[len(ok) // 2])
    row.update(repeats=len(runs), ok_repeats=len(ok), tokens_per_s_all=[r["tokens_per_s"] for r in runs
                                                                          if r.get("tokens_per_s")],
               tokens_per_s_min=ok[0]["tokens_per_s"], tokens_per_s_max=ok[-1]["tokens_per_s"])
    if len(ok) % 2 == 0:  # the median of an even count is the mean of the middle two
        mid = ok[len(ok) // 2 - 1:len(ok) // 2 + 1]
        scale = (mid[0]["tokens_per_s"] + mid[1]["tokens_per_s"]) / 2 / row["tokens_per_s"]
        for k in ("tokens_per_s", "tflops_per_gpu", "mfu", "mfu_causal", "mfu_fp8_peak"):
            if isinstance(row.get(k), (int, float)):
                row[k] *= scale
    return row


def table(rows, ref_name):
    ref = next((r for r in rows if r["name"] == ref_name and r.get("tokens_per_s")), None)
    lines = ["| run | status | tokens/s, median (min-max) | TFLOP/s/GPU | MFU | MFU, causal | MFU, fp8 peak | "
             "peak mem (GiB) | planned (GiB) | step (s): forward+backward / optimizer (offloaded: CPU Adam, D2H "
             "wait) | vs " + ref_name + " |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    f = lambda v, fmt: fmt.format(v) if isinstance(v, (int, float)) else "-"  # noqa: E731
    pct = lambda v: f(v and 100 * v, "{:.1f}%")  # noqa: E731
    for r in rows:
        tps = r.get("tokens_per_s")
        ratio = f"{tps / ref['tokens_per_s']:.3f}x" if ref and tps else "-"
        status = r.get("status")
        if r.get("repeats", 1) > 1:
            status = f"{status} ({r.get('ok_repeats')}/{r['repeats']})"
        err = "" if r.get("status") == "ok" else f" ({(r.get('error') or '')[:300]})"
        spread = (f" ({r['tokens_per_s_min']:,.0f}-{r['tokens_per_s_max']:,.0f})"
                  if r.get("ok_repeats", 0) > 1 else "")
        lines.append(f"| {r['name']} | {status}{err} | {f(tps, '{:,.0f}')}{spread} | "
                     f"{f(r.get('tflops_per_gpu'), '{:.1f}')} | {pct(r.get('mfu'))} | {pct(r.get('mfu_causal'))} | "
                     f"{pct(r.get('mfu_fp8_peak'))} | {f(r.get('peak_memory_gib'), '{:.1f}')} | "
                     f"{f(r.get('planned_gib'), '{:.1f}')} | {split(r)} | {ratio} |")
    return "\n".join(lines)


def split(r):
    """A train.py run's step time and the backend's split of it (result.json's step_split_s; with an offloaded
    optimizer its CPU Adam and the waits for the gradients' D2H copies, optimizer_split_s), median run."""
    sp, st = r.get("step_split_s"), r.get("step_time_s")
    if not sp or not st:
        return "-"
    out = f"{st:.2f}: {sp.get('forward_backward_s', 0):.2f} / {sp.get('optimizer_s', 0):.2f}"
    op = r.get("optimizer_split_s")
    if op:
        out += f" (CPU Adam {op.get('cpu_adam_s', 0):.2f}, D2H wait {op.get('d2h_wait_s', 0):.2f})"
    return out


def environment():
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"  # a CPU run checks the script
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
        if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                          text=True, timeout=10).stdout.strip():
            commit += "+changes"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    vers = {"commit": commit, "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu}
    # read from the installed distributions: importing megatron.core and torchao for their __version__ costs
    # seconds of CPU per table (megatron's import-time torch.compile calls load the compiler stack)
    for mod, dists in (("megatron.core", ("megatron-core",)), ("torchtitan", ("torchtitan",)),
                       ("torchao", ("torchao",)), ("triton", ("triton", "pytorch-triton-rocm"))):
        for dist in dists:
            try:
                vers[mod] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError as e:
                vers[mod] = f"missing ({type(e).__name__})"
    return vers


def with_iters(points, iters):
    """Each point run for `iters` steps, the first 4 untimed."""
    return [(n, a + (["--steps", str(iters - 4), "--warmup", "4"] if a[0] != "train.py" else
                     [f"training.train_iters={iters}", "training.timing_warmup_steps=4",
                      "training.lr_warmup_iters=2"])) for n, a in points]


def at_micro_batch(points, micro_batch):
    """Each point at this micro batch and one micro batch per optimizer step: a preset that accumulates (the
    TorchTitan one sets gradient_accumulation_steps) would otherwise ask for a global batch of several."""
    mb = str(micro_batch)
    return [(n, a + (["--batch", mb] if a[0] != "train.py" else
                     [f"training.micro_batch_size={mb}", f"training.global_batch_size={mb}",
                      "training.gradient_accumulation_steps=1"])) for n, a in points]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="core", choices=sorted(SUITES))
    ap.add_argument("--only", nargs="*", help="run names to keep")
    ap.add_argument("--extra", action="append", default=[], help="NAME=ARGV: an extra train.py point, e.g. "
                    "'mega mb16=backend=megatron training.micro_batch_size=16'")
    ap.add_argument("--peer", action="append", default=[], help="NAME=SCRIPT ARGS: a point run by another script "
                    "of bench/ that prints reference.py's JSON line, e.g. 'titan=bench/torchtitan_stock.py --compile'")
    ap.add_argument("--merge", nargs="+", metavar="RUNS_JSON", help="no runs: one table from the bench_*_runs.json "
                    "of earlier invocations (e.g. one repeat each), their runs of a point pooled in the given order")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each point, interleaved; figures are medians")
    ap.add_argument("--iters", type=int, help="steps per run, the first 4 untimed (default: each point's own: "
                    "20 with 5 untimed)")
    ap.add_argument("--micro-batch", type=int, help="every point at this micro batch and one micro batch per step "
                    "(the reference's --batch; train.py's micro and global batch), e.g. to fit a smaller GPU")
    ap.add_argument("--deadline-s", type=float, help="start no run that the mean run time so far says would end "
                    "after this many seconds; the table then holds the repeats that ran")
    ap.add_argument("--ref", default="reference/compile_fused")
    ap.add_argument("--append", help="markdown file to append the section to")
    ap.add_argument("--log-dir", help="per-point logs (default: $OUT, else outputs/bench)")
    ap.add_argument("--tag", help="name of the bench_<tag>.md/json written to $OUT (default: the suite)")
    args = ap.parse_args()
    if args.merge:
        return merge(args)
    points = [p for p in SUITES[args.suite] if not args.only or p[0] in args.only]
    for e in args.extra:
        name, argv = e.split("=", 1)
        argv = argv.split()
        bad = [a for a in argv if "=" in a.split("=", 1)[1] and not a.split("=", 1)[0].startswith(("+", "~"))]
        if bad and bad[0] == argv[0]:  # 'label with = in it=overrides' splits inside the label
            ap.error(f"--extra {e!r}: the label ends at the first '=', so the overrides start with {argv[0]!r}; "
                     "write the label without '='")
        # an experiment preset brings its own model and batch (a command-line model= would override it)
        base = QUIET if any(a.startswith("experiment=") for a in argv) else BENCH
        points.append((name, ["train.py", *base, *argv]))
    for e in args.peer:
        name, _, argv = e.partition("=")
        if not argv or not argv.split()[0].startswith("bench/"):
            ap.error(f"--peer {e!r}: NAME=bench/<script>.py ARGS (the label ends at the first '=')")
        points.append((name, shlex.split(argv)))
    if args.iters is not None:  # (0 too: an error, never the points' own count unasked)
        if args.iters < 6:
            ap.error(f"--iters {args.iters}: at least 6 (4 untimed warm-up steps, then 2 timed)")
        points = with_iters(points, args.iters)
    if args.micro_batch is not None:
        if args.micro_batch < 1:
            ap.error(f"--micro-batch {args.micro_batch}: sequences per micro batch, at least 1 (e.g. 4 on an H100)")
        points = at_micro_batch(points, args.micro_batch)
    out = os.environ.get("OUT")
    log_dir = args.log_dir or out or os.path.join(ROOT, "outputs", "bench")
    os.makedirs(log_dir, exist_ok=True)
    runs = {name: [] for name, _ in points}
    total, done, t_start = len(points) * args.repeats, 0, time.time()
    stop = False
    for rep in range(args.repeats):
        for name, argv in points:
            if args.deadline_s and done and (time.time() - t_start) / done * (done + 1) > args.deadline_s:
                print(f"[bench] deadline: {total - done} runs not started", flush=True)
                stop = True
                break
            done += 1
            print(f"[bench {done}/{total}] {name} (repeat {rep + 1}/{args.repeats}) ...", flush=True)
            r = run_point(name, argv, args.timeout, log_dir, rep)
            runs[name].append(r)
            left = (time.time() - t_start) / done * (total - done)
            print(f"  -> {r.get('status')} tokens/s={r.get('tokens_per_s')} mfu={r.get('mfu')} ({r['wall_s']:.0f}s; "
                  f"about {left / 60:.0f} min left)", flush=True)
            if out:  # what ran so far survives a killed bench
                with open(os.path.join(out, f"bench_{args.tag or args.suite}_runs.json"), "w") as f:
                    json.dump(runs, f, default=str)
        if stop:
            break
    runs = {name: rs for name, rs in runs.items() if rs}
    report(args, runs, [name for name, _ in points], out)


def merge(args):
    """bench_<tag>.json files (their env is the measuring machine's) or bench_<tag>_runs.json files."""
    runs, env = {}, None
    for path in args.merge:
        with open(path) as f:
            d = json.load(f)
        if "runs" in d and "env" in d:
            env = env or d["env"]
            d = d["runs"]
        for name, rs in d.items():
            runs.setdefault(name, []).extend(rs)
    args.repeats = max((len(rs) for rs in runs.values()), default=0)
    report(args, runs, list(runs), os.environ.get("OUT"), env)


def report(args, runs, names, out, env=None):
    rows = [combine(runs[name]) for name in names if name in runs]
    env = env or environment()
    ran = sorted({len(rs) for rs in runs.values()})
    md = [f"### {args.tag or args.suite}: {datetime.datetime.now():%Y-%m-%d %H:%M} on {env['gpu']}, "
          f"commit {env['commit']}, {'-'.join(map(str, ran)) or 0} of {args.repeats} interleaved repeats ran", "",
          "Versions: " + ", ".join(f"{k} {v}" for k, v in env.items()), "", table(rows, args.ref), "", "Commands:", ""]
    md += [f"- `{r['name']}`: `{r['cmd']}`" for r in rows]
    text = "\n".join(md) + "\n"
    print(text)
    if out:
        with open(os.path.join(out, f"bench_{args.tag or args.suite}.md"), "w") as f:
            f.write(text)
        with open(os.path.join(out, f"bench_{args.tag or args.suite}.json"), "w") as f:
            json.dump({"env": env, "rows": rows, "runs": runs}, f, indent=2, default=str)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
