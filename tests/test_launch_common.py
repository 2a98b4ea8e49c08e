"""Helpers shared by the launch, sweep and Slurm tests (no tests here): run train.py as a user would, in a subprocess."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

# A short run of the debug model: 3 steps, no LR warm-up (warm-up must be shorter than the run), every step timed.
SHORT = ["training.train_iters=3", "training.lr_warmup_iters=0", "training.timing_warmup_steps=0"]
# The smallest batch (one sequence of 32 tokens): a CPU step costs milliseconds instead of a good part of a second.
# For runs whose checks do not depend on a step taking time (losses, resume, statuses); a test that signals a run
# once a step is logged, and needs it stopped before its last step, keeps the default batch.
TINY = ["training.micro_batch_size=1", "training.seq_length=32"]


DIST_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def train_env(env=None):
    e = dict(os.environ)
    # One BLAS thread per process: on a loaded 2-core CI machine, oversubscribed OpenMP threads make CPU steps
    # seconds instead of milliseconds.
    e["OMP_NUM_THREADS"] = "1"
    # a rendezvous left in this process's env by an in-process trainer (a module fixture's, which outlives the
    # per-test env restore) would send the child to a port this process still listens on
    for k in DIST_ENV:
        e.pop(k, None)
    e.update(env or {})
    return e


def run_train(args, timeout=600, env=None):
    """python train.py ARGS from the repo root; returns the CompletedProcess (stdout and stderr merged)."""
    return subprocess.run([PY, "train.py", *args], cwd=ROOT, env=train_env(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def start_train(args, env=None):
    """python train.py ARGS started in the background (a test reads its output line by line and signals it)."""
    return subprocess.Popen([PY, "train.py", *args], cwd=ROOT, env=train_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def tail(p, n=60):
    return "\n".join(p.stdout.splitlines()[-n:])


def load(path):
    with open(path) as f:
        return json.load(f)


def result_files(d):
    out = []
    for root, _, files in os.walk(d):
        out += [os.path.join(root, f) for f in files if f == "result.json"]
    return sorted(out)


def dry_run_jobs(stdout):
    """The JSON object each dry-run job of a multirun prints (indented: from a "{" line to a "}" line)."""
    out, block = [], None
    for line in stdout.splitlines():
        if line == "{":
            block = [line]
        elif block is not None:
            block.append(line)
            if line == "}":
                out.append(json.loads("\n".join(block)))
                block = None
    return out
