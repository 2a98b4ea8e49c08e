"""Backend-neutral checkpoints: atomic save, keep-last-K, validation, and `resume=auto`.

Layout under `checkpoint.dir` (default `<run_dir>/checkpoints`):

    step_000006/                 one checkpoint = one directory, named by the last completed step
        <backend files>          written by Trainer.save_checkpoint(path, step) (megatron: dist_checkpointing,
                                 torchtitan: torch.distributed.checkpoint), collectively on every rank
        rng/rank_00000.pt        python / numpy / torch / cuda RNG states of each rank
        primus_meta.json         written LAST: step, backend, world size, config fingerprint, the trainer's extra
                                 state (data position, ...) and the size + crc32 of every other file

Atomicity: everything is written under `.tmp-step_000006/` and rank 0 renames it to `step_000006/` after every rank
has finished (a barrier) and the meta file is on disk. A crash mid-save leaves only a `.tmp-*` directory, which no
reader ever considers (and the next save removes). Files damaged after the rename (truncated copy, bit rot) fail the
size/crc32 check on load. `resume=auto` walks the checkpoints newest first and takes the first valid one, saying
which ones it skipped and why; an explicit `resume=<path>` that is not valid is an error naming the path and the
problem.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
import zlib
from typing import Any, Dict, List, Optional, Tuple

META_FILE = "primus_meta.json"
FORMAT = 1
STEP_RE = re.compile(r"^step_(\d+)$")
TMP_PREFIX = ".tmp-"
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: the message names the path and what is wrong."""


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def default_root(cfg, run_dir: str) -> str:
    return os.path.abspath(cfg.checkpoint.dir or os.path.join(run_dir, "checkpoints"))


# ----------------------------------------------------------------------------------------------- files and crc32

def crc32_file(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                return crc
            crc = zlib.crc32(b, crc)


def list_files(path: str) -> List[str]:
    """Every file under a checkpoint dir except the meta file, as sorted relative paths."""
    out = []
    for root, _, files in os.walk(path):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), path)
            if rel != META_FILE:
                out.append(rel)
    return sorted(out)


def _share(items: List[str], rank: int, world: int) -> List[str]:
    return items[rank::world]


def _dist():
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist
    except ImportError:
        pass
    return None


def _rank_world() -> Tuple[int, int]:
    d = _dist()
    return (d.get_rank(), d.get_world_size()) if d else (0, 1)


def _barrier() -> None:
    d = _dist()
    if d:
        d.barrier()


def _gather_lists(mine: List[Any]) -> List[Any]:
    """Concatenate a list from every rank (same result on every rank)."""
    d = _dist()
    if not d:
        return list(mine)
    out: List[Any] = [None] * d.get_world_size()
    d.all_gather_object(out, mine)
    return [x for part in out for x in part]


def _broadcast(obj: Any) -> Any:
    d = _dist()
    if not d:
        return obj
    box = [obj]
    d.broadcast_object_list(box, src=0)
    return box[0]


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_meta(path: str) -> Dict[str, Any]:
    """The checkpoint's primus_meta.json, or CheckpointError saying why it cannot be read."""
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path}: not a directory")
    mp = os.path.join(path, META_FILE)
    if not os.path.isfile(mp):
        raise CheckpointError(f"checkpoint {path}: no {META_FILE} (the save did not finish, or this is not a "
                              "primus checkpoint)")
    try:
        with open(mp) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: {META_FILE} unreadable ({e})") from e
    for k in ("format", "step", "backend", "files"):
        if k not in meta:
            raise CheckpointError(f"checkpoint {path}: {META_FILE} lacks '{k}'")
    if meta["format"] != FORMAT:
        raise CheckpointError(f"checkpoint {path}: format {meta['format']}, this version reads format {FORMAT}")
    return meta


def check_sizes(path: str, meta: Dict[str, Any]) -> List[str]:
    """Cheap check: every recorded file exists with its recorded size."""
    problems = []
    for rel, rec in sorted(meta["files"].items()):
        fp = os.path.join(path, rel)
        if not os.path.isfile(fp):
            problems.append(f"{rel} is missing")
            continue
        size = os.path.getsize(fp)
        if size != rec["size"]:
            problems.append(f"{rel} has {size} bytes, {rec['size']} were written (truncated or replaced)")
    return problems


def check_crcs(path: str, meta: Dict[str, Any], rels: List[str]) -> List[str]:
    problems = []
    for rel in rels:
        fp = os.path.join(path, rel)
        rec = meta["files"][rel]
        if not os.path.isfile(fp) or os.path.getsize(fp) != rec["size"]:
            continue  # reported by check_sizes
        crc = crc32_file(fp)
        if crc != rec["crc32"]:
            problems.append(f"{rel} crc32 {crc:08x} != {rec['crc32']:08x} written (corrupt)")
    return problems


def verify(path: str, backend: Optional[str] = None, distributed: bool = True) -> List[str]:
    """Problems of one checkpoint (empty list = valid). With torch.distributed up, every rank checks a share of the
    files' crc32 and all ranks get the same answer; call it on every rank then."""
    problems: List[str] = []
    meta = None
    try:
        meta = read_meta(path)
    except CheckpointError as e:
        problems.append(str(e).split(": ", 1)[1])
    if meta is not None:
        problems += check_sizes(path, meta)
        if backend and meta["backend"] != backend:
            problems.append(f"written by backend {meta['backend']}, this run is backend {backend}")
    rank, world = _rank_world() if distributed else (0, 1)
    rels = sorted(meta["files"]) if meta is not None and not problems else []
    mine = check_crcs(path, meta, _share(rels, rank, world)) if rels else []
    if distributed and _dist():
        # every rank decides from the same list (rank 0's meta/size problems + everyone's crc problems)
        problems = _broadcast(problems) + sorted(_gather_lists(mine))
    else:
        problems += mine
    return problems


def list_checkpoints(root: str) -> List[Tuple[int, str]]:
    """(step, path) of every `step_N` dir under root, newest first (validity not checked)."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = STEP_RE.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out, reverse=True)


def find_latest_valid(root: str, backend: Optional[str] = None,
                      distributed: bool = True) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest valid checkpoint under root, and the newer ones skipped with their reasons."""
    skipped: List[Tuple[str, str]] = []
    for _, path in list_checkpoints(root):
        problems = verify(path, backend, distributed)
        if not problems:
            return path, skipped
        skipped.append((path, "; ".join(problems)))
    return None, skipped


def config_fingerprint(cfg) -> str:
    """sha256 of the settings that shape the model and its training state (not run length or checkpoint knobs)."""
    from omegaconf import OmegaConf

    d = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    for k in ("checkpoint", "launcher", "dry_run", "mode", "plan"):
        d.pop(k, None)
    for k in ("train_iters", "log_interval", "timing_warmup_steps", "on_nonfinite"):
        d.get("training", {}).pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- RNG state

def rng_state() -> Dict[str, Any]:
    import numpy as np
    import torch

    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: Dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _rng_file(path: str, rank: int) -> str:
    return os.path.join(path, "rng", f"rank_{rank:05d}.pt")


# ----------------------------------------------------------------------------------------------- manager

class CheckpointManager:
    """Save / prune / resume for one run, on every rank (the calls are collective)."""

    def __init__(self, cfg, ctx, trainer, say=print):
        self.cfg, self.ctx, self.trainer, self.say = cfg, ctx, trainer, say
        self.c = cfg.checkpoint
        self.root = default_root(cfg, ctx.run_dir)
        self.backend = cfg.backend.name.value
        self.saved: List[str] = []
        self.last_saved_step: Optional[int] = None

    # ------------------------------------------------------------------ when
    @property
    def enabled(self) -> bool:
        return self.c.interval > 0 or self.c.save_at_end

    def due(self, step: int, last: bool) -> bool:
        return (self.c.interval > 0 and step % self.c.interval == 0) or (last and self.c.save_at_end)

    # ------------------------------------------------------------------ save
    def save(self, step: int) -> str:
        rank, world = _rank_world()
        name = step_dir_name(step)
        final = os.path.join(self.root, name)
        tmp = os.path.join(self.root, TMP_PREFIX + name)
        t0 = time.perf_counter()
        if rank == 0:
            os.makedirs(self.root, exist_ok=True)
            for n in os.listdir(self.root):  # leftovers of saves that crashed: never valid, never read
                if n.startswith(TMP_PREFIX):
                    shutil.rmtree(os.path.join(self.root, n), ignore_errors=True)
            os.makedirs(tmp)
        _barrier()
        extra = self.trainer.save_checkpoint(tmp, step) or {}
        import torch

        os.makedirs(os.path.dirname(_rng_file(tmp, rank)), exist_ok=True)
        torch.save(rng_state(), _rng_file(tmp, rank))
        _maybe_fail_during_save(step)
        _barrier()
        rels = _broadcast(list_files(tmp) if rank == 0 else None)
        recs = _gather_lists([(rel, os.path.getsize(os.path.join(tmp, rel)), crc32_file(os.path.join(tmp, rel)))
                              for rel in _share(rels, rank, world)])
        if rank == 0:
            meta = {
                "format": FORMAT,
                "step": step,
                "backend": self.backend,
                "model": self.cfg.model.name,
                "world_size": world,
                "train_iters": self.cfg.training.train_iters,
                "config_fingerprint": config_fingerprint(self.cfg),
                "trainer_state": extra,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "run_dir": os.path.abspath(self.ctx.run_dir),
                "files": {rel: {"size": size, "crc32": crc} for rel, size, crc in sorted(recs)},
            }
            with open(os.path.join(tmp, META_FILE + ".part"), "w") as f:
                json.dump(meta, f, indent=1, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.replace(os.path.join(tmp, META_FILE + ".part"), os.path.join(tmp, META_FILE))
            _fsync_dir(tmp)
            if os.path.exists(final):  # e.g. the same step saved again after a resume: replace it whole
                old = os.path.join(self.root, TMP_PREFIX + "old-" + name)
                os.rename(final, old)
                os.rename(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, final)
            _fsync_dir(self.root)
            self._prune()
        _barrier()
        self.saved.append(final)
        self.last_saved_step = step
        mb = sum(r[1] for r in recs) / 2**20 if rank == 0 else 0
        self.say(f"[primus] checkpoint step {step} saved: {final} ({mb:.1f} MiB on rank 0's view, "
                 f"{time.perf_counter() - t0:.2f}s)")
        return final

    def _prune(self) -> None:
        k = self.c.keep_last
        if k <= 0:
            return
        for _, path in list_checkpoints(self.root)[k:]:
            shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------ resume
    def precheck(self) -> None:
        """Before the trainer is built: an explicit resume path must at least look like a whole checkpoint."""
        r = self.c.resume
        if r in (None, "", "auto"):
            return
        path = os.path.abspath(r)
        try:
            meta = read_meta(path)
        except CheckpointError as e:
            raise _config_error(path, str(e)) from e
        problems = check_sizes(path, meta)
        if meta["backend"] != self.backend:
            problems.append(f"written by backend {meta['backend']}, this run is backend {self.backend}")
        if problems:
            raise _config_error(path, f"checkpoint {path}: " + "; ".join(problems))

    def resume(self) -> Optional[Dict[str, Any]]:
        """Restore the checkpoint that checkpoint.resume names (after trainer.setup). Returns what was restored:
        {"path", "step", "trainer_state", "skipped": [(path, reason)]}, or None for a fresh start."""
        r = self.c.resume
        if r in (None, "") and requeued_slurm_job():
            r = "auto"
            self.say(f"[primus] requeued Slurm job (SLURM_RESTART_COUNT={os.environ['SLURM_RESTART_COUNT']}): "
                     f"resuming from the newest valid checkpoint in {self.root}")
        if r in (None, ""):
            return None
        skipped: List[Tuple[str, str]] = []
        if r == "auto":
            path, skipped = find_latest_valid(self.root, self.backend)
            for p, why in skipped:
                self.say(f"[primus] checkpoint {p} is not valid ({why}); falling back to the previous one")
            if skipped and path is not None:
                self.say(f"[primus] resume=auto: using {path} (the newest valid checkpoint)")
            if path is None:
                self.say(f"[primus] resume=auto: no valid checkpoint in {self.root}; starting from step 1")
                return {"path": None, "step": 0, "skipped": skipped} if skipped else None
        else:
            path = os.path.abspath(r)
            problems = verify(path, self.backend)
            if problems:
                raise _config_error(path, f"checkpoint {path}: " + "; ".join(problems))
        meta = read_meta(path)
        rank, world = _rank_world()
        if meta.get("world_size") != world:
            self.say(f"[primus] warning: checkpoint {path} was written by {meta.get('world_size')} ranks, this run "
                     f"has {world}: model/optimizer are resharded, data position and RNG follow rank numbers")
        fp = config_fingerprint(self.cfg)
        if meta.get("config_fingerprint") != fp:
            self.say(f"[primus] warning: checkpoint {path} was written with a different config (fingerprint "
                     f"{meta.get('config_fingerprint')} vs {fp}): model/optimizer settings changed since")
        self.trainer.load_checkpoint(path, meta)
        rf = _rng_file(path, rank)
        if os.path.isfile(rf):
            import torch

            set_rng_state(torch.load(rf, weights_only=False))
        self.say(f"[primus] resumed from {path} (step {meta['step']}); next step {meta['step'] + 1}")
        return {"path": path, "step": int(meta["step"]), "trainer_state": meta.get("trainer_state", {}),
                "skipped": skipped, "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)}


def requeued_slurm_job() -> bool:
    """A Slurm job that was requeued (preemption, `scontrol requeue`) runs again with SLURM_RESTART_COUNT >= 1: it
    resumes from its run dir's checkpoints even when checkpoint.resume is null (the pickled submission still says
    what the first attempt was told; the run dir is the same)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0
    except ValueError:
        return False


def _config_error(path: str, msg: str):
    from primus.config.errors import ConfigError, ConfigIssue

    return ConfigError(ConfigIssue(["checkpoint.resume"], path, msg.replace(f"checkpoint {path}: ", "", 1)
                                   if msg.startswith(f"checkpoint {path}: ") else msg,
                                   "point checkpoint.resume at a complete checkpoint dir (step_N with "
                                   f"{META_FILE}), or use checkpoint.resume=auto to take the newest valid one"))


# ----------------------------------------------------------------------------------------------- test hooks

def _maybe_fail_during_save(step: int) -> None:
    """TEST HOOK: PRIMUS_INJECT_SAVE_FAILURE_AT_STEP=N raises after the backend files of step N are written and
    before the checkpoint is committed (stands for a crash mid-save)."""
    v = os.environ.get("PRIMUS_INJECT_SAVE_FAILURE_AT_STEP")
    if v and int(v) == step:
        raise RuntimeError(f"injected failure while saving the checkpoint of step {step} "
                           "(PRIMUS_INJECT_SAVE_FAILURE_AT_STEP)")
