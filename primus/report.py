"""One table for any set of finished runs: run dirs (with result.json) or sweep dirs (with numbered job dirs).

    python -m primus.report outputs/sweeps/2026-11-29_10-00-00-123456            # print the table (markdown)
    python -m primus.report outputs/runs/A outputs/runs/B --csv t.csv --png t.png
    python -m primus.report SWEEP_DIR --write                                     # results.{csv,md} + PNG in SWEEP_DIR

Columns: what differs between the runs compared (the command-line overrides that differ, then the group choices and
config values that differ, read from each result.json), then the metrics that any row has (status, tokens/s/GPU,
TFLOP/s/GPU, MFU, peak memory, median step time, world size, final and validation loss, a plan's estimate, the
sweep objective), run dir and the whole error message. Rows are sorted by throughput (best first); rows without one
(failed, invalid, pruned, no result) come last in job order. The sweep callback (primus/sweep.py) writes the same
table and PNG.

A run dir of a run that only described itself (dry run, mode=plan) is skipped when given as a run dir (such runs
keep no run dir any more; older ones may remain): `python -m primus.report outputs/runs/*` compares runs that ran.
Inside a sweep dir every point is a row: a dry-run or plan sweep tabulates what it found.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from primus.results import RESULT_FILE

# column key -> header; the metric columns after the swept-choice columns
METRIC_COLUMNS: Tuple[Tuple[str, str], ...] = (
    ("status", "status"),
    ("tokens_per_s_per_gpu", "tokens/s/GPU"),
    ("tflops_per_gpu", "TFLOP/s/GPU"),
    ("mfu", "MFU"),
    ("peak_memory_gib", "peak mem (GiB)"),
    ("step_time_s", "step time (s)"),
    ("world_size", "world"),
    ("final_loss", "final loss"),
    ("val_loss", "val loss"),
    ("plan_fits", "fits"),
    ("plan_needed_gib", "est. mem (GiB)"),
    ("plan_capacity_gib", "GPU mem (GiB)"),
    ("plan_tokens_per_s_per_gpu", "est. tokens/s/GPU"),
    ("objective", "objective"),
)
TRAIL_COLUMNS: Tuple[Tuple[str, str], ...] = (("run_dir", "run dir"), ("error", "error"))
NO_RESULT = "no_result"  # a job dir without result.json: still running, or killed before it could write one
DESCRIBED = ("valid", "planned")  # a dry run's and a plan's status (sweep points only)
# config values that differ between any two runs without describing the experiment
NOT_COMPARED = ("extra", "job_id", "checkpoint.dir", "checkpoint.resume", "logging", "profile", "launcher.env",
                "launcher.master_port", "launcher.master_addr")


def _load_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _job_overrides(job_dir: str) -> List[str]:
    """The job's command-line overrides as Hydra saved them (.hydra/overrides.yaml), without importing yaml libs."""
    path = os.path.join(job_dir, ".hydra", "overrides.yaml")
    out: List[str] = []
    try:
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                if line.startswith("- "):
                    v = line[2:].strip()
                    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                        v = v[1:-1]
                    out.append(v)
    except OSError:
        pass
    return out


def split_override(o: str) -> Tuple[str, str]:
    key, _, val = o.partition("=")
    return key.lstrip("+~"), val


def _one_line(s: Optional[str]) -> Optional[str]:
    """The whole message on one line (a table cell cannot hold line breaks)."""
    return " ".join(str(s).split()) if s else None


def row_of(result: Dict[str, Any], run_dir: str) -> Dict[str, Any]:
    """One table row from a result.json."""
    step = result.get("step_time_s")
    mem = result.get("memory") or {}
    peak = mem.get("max_allocated_gib") if isinstance(mem, dict) else None
    if peak is None:
        peak = result.get("peak_memory_gib")
    plan = result.get("plan") if isinstance(result.get("plan"), dict) else {}
    obj = result.get("objective") if isinstance(result.get("objective"), dict) else {}
    error = result.get("error") or obj.get("error") if result.get("status") != "planned" else None
    return {
        "run_dir": run_dir,
        "job_num": result.get("job_num"),
        "overrides": list(result.get("overrides") or _job_overrides(run_dir)),
        "status": result.get("status", "?"),
        "tokens_per_s_per_gpu": result.get("tokens_per_s_per_gpu"),
        "tflops_per_gpu": result.get("tflops_per_gpu"),
        "mfu": result.get("mfu"),
        "peak_memory_gib": peak,
        "step_time_s": step.get("median") if isinstance(step, dict) else step,
        "world_size": result.get("world_size"),
        "final_loss": result.get("final_loss"),
        "val_loss": result.get("val_loss"),
        "plan_fits": None if "fits" not in plan else ("yes" if plan["fits"] else "no"),
        "plan_needed_gib": plan.get("needed_gib"),
        "plan_capacity_gib": plan.get("capacity_gib"),
        "plan_tokens_per_s_per_gpu": plan.get("tokens_per_s_per_gpu"),
        "objective": obj.get("value"),
        "error": _one_line(error),
        "described": bool(result.get("describe_only")),
        "choices": result.get("choices") if isinstance(result.get("choices"), dict) else {},
        "config": _flat(result.get("config")) if isinstance(result.get("config"), dict) else {},
    }


def _flat(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if not isinstance(v, (list, dict)) else json.dumps(v)
    return out


def describe_only_run(run_dir: str) -> bool:
    """A run dir of a dry run or plan: its result.json says so, or (older dirs, no result.json) its overrides."""
    res = _load_json(os.path.join(run_dir, RESULT_FILE))
    if res is not None:
        return bool(res.get("describe_only"))
    kv = dict(split_override(o) for o in _job_overrides(run_dir))
    return kv.get("dry_run", "").lower() == "true" or kv.get("mode") == "plan"


def _job_num_of(name: str) -> Optional[int]:
    try:
        return int(name)
    except ValueError:
        return None


def _is_job_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, RESULT_FILE)) or os.path.isdir(os.path.join(path, ".hydra"))


def job_dirs(sweep_dir: str) -> List[str]:
    """Job dirs of a sweep dir: subdirs holding result.json or .hydra/, numbered ones in numeric order."""
    subs = []
    for name in os.listdir(sweep_dir):
        p = os.path.join(sweep_dir, name)
        if name.startswith(".") or not os.path.isdir(p) or not _is_job_dir(p):
            continue
        n = _job_num_of(name)
        subs.append(((0, n, "") if n is not None else (1, 0, name), p))
    return [p for _, p in sorted(subs)]


def collect(dirs: Iterable[str]) -> List[Dict[str, Any]]:
    """Rows for run dirs and sweep dirs (a dir with result.json is a run; otherwise its job subdirs are)."""
    rows: List[Dict[str, Any]] = []
    for d in dirs:
        if not os.path.isdir(d):
            raise FileNotFoundError(f"not a directory: {d}")
        if os.path.isfile(os.path.join(d, RESULT_FILE)):
            runs = [d]
        else:
            runs = job_dirs(d)
            if not runs and os.path.isdir(os.path.join(d, ".hydra")):
                runs = [d]  # a run dir whose job died before result.json
        if runs == [d] and describe_only_run(d):
            continue  # a dry run or plan given as a run dir: it ran nothing to compare
        for r in runs:
            res = _load_json(os.path.join(r, RESULT_FILE))
            if res is None:
                res = {"status": NO_RESULT, "overrides": _job_overrides(r),
                       "error": "no result.json (still running, or killed before writing it: see the job's log)"}
            row = row_of(res, r)
            row["sweep"] = d if r != d else None
            if row["job_num"] is None:
                row["job_num"] = _job_num_of(os.path.basename(os.path.normpath(r)))
            rows.append(row)
    return rows


def _varying(values: Iterable[Any]) -> bool:
    return len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1


def compared_keys(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The columns that tell the rows apart: the overrides that differ (swept_keys), then the group choices that
    differ, then the config values that differ outside those groups (read from each result.json's config). The
    points of one sweep differ by what was swept: its table is the swept keys (a preset sweep would otherwise show
    every group the presets choose)."""
    keys = swept_keys(rows)
    sweeps = {r.get("sweep") for r in rows}
    if len(rows) < 2 or (len(sweeps) == 1 and None not in sweeps):
        return keys
    shown = set(keys)
    groups = [g for g in dict.fromkeys(g for r in rows for g in r.get("choices") or {})
              if g not in shown and _varying((r.get("choices") or {}).get(g) for r in rows)]
    keys += groups
    shown.update(groups)
    if not all(r.get("config") for r in rows):
        return keys
    # a group chosen differently explains its own values; a swept key explains itself
    covered = tuple(f"{k}." for k in shown) + tuple(f"{k}." for k in ("tuning",) if "tuning_stage" in shown)
    skip = tuple(NOT_COMPARED) + tuple(f"{k}." for k in NOT_COMPARED)
    for k in dict.fromkeys(k for r in rows for k in r["config"]):
        if k in shown or k.startswith(covered) or k == "experiment" or k.startswith(skip):
            continue
        if _varying(r["config"].get(k) for r in rows):
            keys.append(k)
    return keys


def _cell(r: Dict[str, Any], k: str) -> Any:
    kv = dict(split_override(o) for o in r["overrides"])
    if k in kv:
        return kv[k]
    if k in (r.get("choices") or {}):
        return r["choices"][k]
    return (r.get("config") or {}).get(k)


def swept_keys(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """Override keys whose value differs between rows (or is missing in some), in first-seen order."""
    order: List[str] = []
    values: Dict[str, set] = {}
    for r in rows:
        kv = dict(split_override(o) for o in r["overrides"])
        for k in kv:
            if k not in values:
                order.append(k)
                values[k] = set()
    for r in rows:
        kv = dict(split_override(o) for o in r["overrides"])
        for k in order:
            values[k].add(kv.get(k))
    varying = [k for k in order if len(values[k]) > 1]
    return varying if varying or len(rows) > 1 else order


def sort_rows(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    def key(ir):
        i, r = ir
        t = _throughput(r)
        ok = isinstance(t, (int, float))
        return (0, -t, i) if ok else (1, 0, i)

    return [r for _, r in sorted(enumerate(rows), key=key)]


def _throughput(r: Dict[str, Any]) -> Optional[float]:
    """Measured tokens/s/GPU of an ok run, or a plan's estimate for a point that fits."""
    t = r.get("tokens_per_s_per_gpu") if r.get("status") == "ok" else None
    if t is None and r.get("status") == "planned" and r.get("plan_fits") == "yes":
        t = r.get("plan_tokens_per_s_per_gpu")
    return t if isinstance(t, (int, float)) else None


def table(rows: Sequence[Dict[str, Any]]) -> Tuple[List[str], List[List[Any]]]:
    """Header and raw cell values (the keys that differ first, then every metric some row has), rows sorted by
    throughput."""
    keys = compared_keys(rows)
    rows = sort_rows(list(rows))
    metrics = [(k, h) for k, h in METRIC_COLUMNS if k == "status" or any(r.get(k) is not None for r in rows)]
    trail = [(k, h) for k, h in TRAIL_COLUMNS if k == "run_dir" or any(r.get(k) is not None for r in rows)]
    header = list(keys) + [h for _, h in metrics] + [h for _, h in trail]
    body = []
    for r in rows:
        body.append([_cell(r, k) for k in keys] + [r.get(k) for k, _ in metrics] + [r.get(k) for k, _ in trail])
    return header, body


def _fmt(header: str, v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if header == "MFU":
            return f"{100 * v:.1f}%"
        if header in ("tokens/s/GPU", "est. tokens/s/GPU"):
            return f"{v:,.0f}"
        if header in ("step time (s)",):
            return f"{v:.4f}" if v < 1 else f"{v:.3f}"
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.1f}"
    return str(v)


def to_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    header, body = table(rows)
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for cells in body:
        lines.append("| " + " | ".join(esc(_fmt(h, v)) for h, v in zip(header, cells)) + " |")
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[Dict[str, Any]]) -> str:
    header, body = table(rows)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for cells in body:
        w.writerow(["" if v is None else v for v in cells])
    return buf.getvalue()


def point_label(r: Dict[str, Any], keys: Sequence[str]) -> str:
    label = ", ".join(f"{k.split('.')[-1]}={_cell(r, k)}" for k in keys) if keys else os.path.basename(r["run_dir"])
    return label or "(defaults)"


def plot_png(rows: Sequence[Dict[str, Any]], path: str, title: str = "throughput per point") -> str:
    """Horizontal bar chart of tokens/s/GPU per point (failed points as empty bars named with their status)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    keys = compared_keys(rows)
    rows = sort_rows(list(rows))
    labels, vals, colors = [], [], []
    for r in rows:
        t = _throughput(r)
        ok = t is not None
        labels.append(point_label(r, keys) + ("" if ok else f"  [{r.get('status')}]"))
        vals.append(t if ok else 0.0)
        colors.append("tab:blue" if ok else "tab:red")
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.45 * max(1, len(rows))))
    y = list(range(len(rows)))[::-1]
    ax.barh(y, vals, color=colors)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("tokens/s/GPU")
    ax.set_title(title, fontsize=10)
    for yi, v, r in zip(y, vals, rows):
        if v:
            mfu = r.get("mfu")
            ax.text(v, yi, f" {v:,.0f}" + (f" ({100 * mfu:.1f}% MFU)" if mfu else ""), va="center", fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_reports(out_dir: str, rows: Sequence[Dict[str, Any]], stem: str = "results",
                  png_name: str = "throughput.png", title: Optional[str] = None) -> Dict[str, str]:
    """results.csv, results.md and the PNG in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"csv": os.path.join(out_dir, f"{stem}.csv"), "md": os.path.join(out_dir, f"{stem}.md"),
             "png": os.path.join(out_dir, png_name)}
    with open(paths["csv"], "w", newline="") as f:
        f.write(to_csv(rows))
    with open(paths["md"], "w") as f:
        f.write(to_markdown(rows))
    plot_png(rows, paths["png"], title or f"tokens/s/GPU: {os.path.basename(os.path.normpath(out_dir))}")
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m primus.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="run dirs (result.json) and/or sweep dirs (job subdirs)")
    ap.add_argument("--csv", help="also write the table as CSV to this file")
    ap.add_argument("--md", help="also write the markdown table to this file")
    ap.add_argument("--png", help="also write the throughput bar chart (the sweep's throughput.png) to this file")
    ap.add_argument("--write", action="store_true",
                    help="write results.csv, results.md and throughput.png into the (single) sweep dir given")
    a = ap.parse_args(argv)
    try:
        rows = collect(a.dirs)
    except FileNotFoundError as e:
        print(f"[primus.report] {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"[primus.report] no runs found in {' '.join(a.dirs)}", file=sys.stderr)
        return 1
    sys.stdout.write(to_markdown(rows))
    if a.write:
        if len(a.dirs) != 1:
            print("[primus.report] --write takes one dir", file=sys.stderr)
            return 2
        for p in write_reports(a.dirs[0], rows).values():
            print(f"[primus.report] wrote {p}", file=sys.stderr)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            f.write(to_csv(rows))
    if a.md:
        with open(a.md, "w") as f:
            f.write(to_markdown(rows))
    if a.png:
        plot_png(rows, a.png, f"tokens/s/GPU: {len(rows)} run(s)")
        print(f"[primus.report] wrote {a.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
