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
size/crc32 check on load. An explicit `resume=<path>` that is not valid is an error naming the path and the problem.

History: checkpoints form a tree, not a set of step numbers. Each meta records its own `id`, its `parent` (the
checkpoint the run's state came from: the previous save, or the one it resumed from) and its `branch`. `HEAD.json`
names the newest save. Resuming from anything but HEAD (a rollback to an earlier step, the usual answer to a loss
spike, or a fresh start over damaged checkpoints) starts a new branch. `resume=auto` follows HEAD's lineage, newest
first, and takes the first valid one, saying which it skipped and why. `keep_last=K` prunes HEAD's lineage beyond
K; checkpoints off it (an abandoned branch, damaged ones) are never pruned: a save whose name one of them holds
renames it aside to `step_N~<id>`, where it stays, listed in result.json and the log until the user deletes it.

Disk space: a save needs room for one more checkpoint while the K it keeps are still there. Before writing, the
free space is compared with the size of the last checkpoint; a save that runs out of space anyway is removed whole
and reported with the dir, the bytes it needed and the bytes free. Older checkpoints are never touched by a failed
save.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import time
import uuid
import zlib
from typing import Any, Dict, List, Optional, Tuple

from primus.launch.dist import barrier

META_FILE = "primus_meta.json"
HEAD_FILE = "HEAD.json"  # the newest save: {"name", "id", "branch"}
FORMAT = 1  # history fields (id, parent, branch) are optional in format 1: older checkpoints have none
STEP_RE = re.compile(r"^step_(\d+)$")
TMP_PREFIX = ".tmp-"
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: the message names the path and what is wrong."""


class OutOfSpace(CheckpointError):
    """A save that does not fit: the message names the dir, the bytes needed and the bytes free."""


def is_out_of_space(e: BaseException) -> bool:
    """ENOSPC anywhere in the exception's chain, including inside torch.distributed.checkpoint's
    CheckpointException, whose `failures` map each rank to an (exception, traceback) pair."""
    todo, seen = [e], set()
    while todo:
        x = todo.pop()
        if not isinstance(x, BaseException) or id(x) in seen:
            continue
        seen.add(id(x))
        if getattr(x, "errno", None) == errno.ENOSPC:
            return True
        todo += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]
    return False


FULL_BELOW = 4 << 20  # bytes free under which a failed write is taken for a full disk


def disk_nearly_full(path: str) -> bool:
    """A failed save on a disk with almost nothing free ran out of space, whatever its error says: torch's zip
    writer reports a short write as "enforce fail at inline_container.cc ... unexpected pos", with no errno."""
    try:
        return shutil.disk_usage(path).free < FULL_BELOW
    except OSError:
        return False


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


# ----------------------------------------------------------------------------------------------- history

MAX_ANCESTRY = 1000  # parents recorded in each meta (a run of 1000 saves keeps its whole chain)


def entry(path: str, meta: Dict[str, Any]) -> Dict[str, Any]:
    """A checkpoint as a history link: its dir name (relative to its root), id and step."""
    return {"name": os.path.basename(os.path.normpath(path)), "id": meta.get("id"), "step": int(meta["step"])}


def read_head(root: str) -> Optional[Dict[str, Any]]:
    """HEAD.json: the newest save of this dir ({"name", "id", "step", "branch", "branches", "ancestry"}), or None
    (no save yet, or a dir written before checkpoints had a history)."""
    try:
        with open(os.path.join(root, HEAD_FILE)) as f:
            head = json.load(f)
    except (OSError, ValueError):
        return None
    return head if isinstance(head, dict) and "name" in head else None


def _write_json(path: str, data: Any) -> None:
    with open(path + ".part", "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".part", path)


def is_link(path: str, link: Dict[str, Any]) -> bool:
    """Does the checkpoint dir at `path` still hold the checkpoint `link` names (same id)? A name can be reused by
    another branch's save after its checkpoint was renamed aside."""
    try:
        return link.get("id") is not None and read_meta(path).get("id") == link["id"]
    except CheckpointError:
        return False


def head_chain(root: str) -> List[Dict[str, Any]]:
    """The current branch, newest first: HEAD and its ancestors (links; some may be pruned)."""
    head = read_head(root)
    if head is None:
        return []
    return [{k: head.get(k) for k in ("name", "id", "step")}] + list(head.get("ancestry") or [])


def config_fingerprint(cfg) -> str:
    """sha256 of the settings that shape the model and its training state (not run length, checkpoint, logging or
    profiling knobs: resuming with logging.tensorboard=false is the same training)."""
    from omegaconf import OmegaConf

    d = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    for k in ("checkpoint", "launcher", "logging", "profile", "dry_run", "mode", "plan"):
        d.pop(k, None)
    for k in ("train_iters", "log_interval", "timing_warmup_steps", "on_nonfinite"):
        d.get("training", {}).pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- RNG state

def rng_state() -> Dict[str, Any]:
    """Every RNG's state as plain tuples, ints and tensors, so that it loads with torch.load(weights_only=True)."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    st = {"python": random.getstate(), "torch": torch.get_rng_state(),
          "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def load_rng_file(path: str) -> Dict[str, Any]:
    """A rank's RNG file, read without running pickled code (weights_only=True). Files written before the numpy
    state was stored as a tensor hold a numpy array: those load with numpy's array classes allowed, nothing else."""
    import pickle

    import numpy as np
    import torch

    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        arrays = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), np._core.multiarray._reconstruct]
        with torch.serialization.safe_globals(arrays):
            return torch.load(path, weights_only=True)


def set_rng_state(st: Dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(st["python"])
    n = st["numpy"]
    if isinstance(n, dict):
        n = (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    np.random.set_state(n)
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
        # history: the chain this run's state descends from (newest first), and the branch its saves extend
        self.ancestry: List[Dict[str, Any]] = []
        self.branch: Optional[int] = None
        self.branches = 0
        self.set_aside: List[str] = []  # off-branch checkpoints a save renamed aside (kept)
        self.last_size: Optional[int] = None  # bytes of the newest checkpoint: what the next save will need

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
        if self.branch is None:
            self._start_branch(None)
        short = None
        if rank == 0:
            os.makedirs(self.root, exist_ok=True)
            for n in os.listdir(self.root):  # leftovers of saves that crashed: never valid, never read
                if n.startswith(TMP_PREFIX):  # (the dir lock guarantees no other run is saving here)
                    shutil.rmtree(os.path.join(self.root, n), ignore_errors=True)
            short = self._space_shortfall(step)
        short = _broadcast(short)
        if short:
            raise OutOfSpace(short)
        if rank == 0:
            os.makedirs(tmp)
        barrier()
        try:
            extra = self.trainer.save_checkpoint(tmp, step) or {}
            import torch

            if not self.c.no_save_rng:
                os.makedirs(os.path.dirname(_rng_file(tmp, rank)), exist_ok=True)
                torch.save(rng_state(), _rng_file(tmp, rank))
            _maybe_fail_during_save(step)
        except BaseException as e:
            if not (is_out_of_space(e) or disk_nearly_full(self.root)):
                raise  # a crash stand-in: the .tmp dir stays until the next save clears it
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # give the space back; the older checkpoints are intact
            raise OutOfSpace(self._space_message(step, "ran out of space while saving")) from e
        barrier()
        rels = _broadcast(list_files(tmp) if rank == 0 else None)
        recs = _gather_lists([(rel, os.path.getsize(os.path.join(tmp, rel)), crc32_file(os.path.join(tmp, rel)))
                              for rel in _share(rels, rank, world)])
        cid = _broadcast(uuid.uuid4().hex[:12] if rank == 0 else None)
        if rank == 0:
            meta = {
                "format": FORMAT,
                "step": step,
                "backend": self.backend,
                "model": self.cfg.model.name,
                "world_size": world,
                "layout": layout_of(self.cfg, world),
                "train_iters": self.cfg.training.train_iters,
                "config_fingerprint": config_fingerprint(self.cfg),
                "trainer_state": extra,
                "contents": {"optimizer": not self.c.no_save_optim, "rng": not self.c.no_save_rng},
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "run_dir": os.path.abspath(self.ctx.run_dir),
                "files": {rel: {"size": size, "crc32": crc} for rel, size, crc in sorted(recs)},
                "id": cid,
                "parent": self.ancestry[0] if self.ancestry else None,
                "ancestry": self.ancestry[:MAX_ANCESTRY],
                "branch": self.branch,
            }
            _write_json(os.path.join(tmp, META_FILE), meta)
            _fsync_dir(tmp)
            if os.path.exists(final):
                self._set_aside(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            _write_json(os.path.join(self.root, HEAD_FILE), {
                "name": name, "id": cid, "step": step, "branch": self.branch, "branches": self.branches,
                "ancestry": self.ancestry[:MAX_ANCESTRY]})
            _fsync_dir(self.root)
        self.ancestry = [{"name": name, "id": cid, "step": step}] + self.ancestry
        if rank == 0:
            self._prune()
        barrier()
        self.saved.append(final)
        self.last_saved_step = step
        mb = sum(r[1] for r in recs) / 2**20 if rank == 0 else 0
        self.last_size = sum(r[1] for r in recs) if rank == 0 else None
        self.say(f"[primus] checkpoint step {step} saved: {final} ({mb:.1f} MiB on rank 0's view, "
                 f"{time.perf_counter() - t0:.2f}s)")
        return final

    def _prune(self) -> None:
        """keep_last=K: the current branch keeps its K newest; nothing off the branch is pruned."""
        k = self.c.keep_last
        if k <= 0:
            return
        kept = 0
        for link in self.ancestry:
            path = os.path.join(self.root, link["name"])
            if not is_link(path, link):
                continue  # pruned before, or not in this dir (a run that resumed from another dir)
            kept += 1
            if kept > k:
                shutil.rmtree(path, ignore_errors=True)

    def _set_aside(self, final: str) -> None:
        """A save's name is held by a checkpoint off this branch (an abandoned branch after a rollback, a damaged
        one, or one written before checkpoints had a history): rename it aside, never delete it."""
        try:
            other = read_meta(final).get("id") or "nohistory"
        except CheckpointError:
            other = "damaged"
        aside, n = f"{final}~{other}", 1
        while os.path.exists(aside):
            n += 1
            aside = f"{final}~{other}.{n}"
        os.rename(final, aside)
        self.set_aside.append(aside)
        self.say(f"[primus] checkpoint {final} belonged to another branch ({other}): kept as {aside}")

    def _start_branch(self, source: Optional[Dict[str, Any]]) -> None:
        """Decide which branch this run's saves extend: HEAD's when the run continues from HEAD, else a new one."""
        head = read_head(self.root)
        self.branches = int(head.get("branches") or head.get("branch") or 1) if head else 0
        if head is not None and source is not None and source.get("id") == head.get("id"):
            self.branch = int(head.get("branch") or 1)
            return
        self.branch = self.branches + 1
        self.branches = self.branch
        if head is not None:
            start = f"from {source['name']} (step {source['step']})" if source else "from step 1"
            self.say(f"[primus] checkpoint history: branch {self.branch} starts {start}; the previous branch's "
                     f"newest, {head['name']} (step {head.get('step')}), is kept off this branch")

    # ------------------------------------------------------------------ disk space
    def _space_shortfall(self, step: int) -> Optional[str]:
        need = self.last_size
        if not need:
            return None  # nothing known yet: the first save finds out (and is removed whole if it does not fit)
        free = shutil.disk_usage(self.root).free
        return self._space_message(step, "not enough space to save", need, free) if free < need else None

    def _space_message(self, step: int, what: str, need: Optional[int] = None, free: Optional[int] = None) -> str:
        need = need if need is not None else self.last_size
        free = free if free is not None else shutil.disk_usage(self.root).free
        needs = f"a checkpoint needs about {need:,} bytes (the last one's size)" if need else \
            "the size of a checkpoint is not known yet"
        k = self.c.keep_last
        keep = (f"; keep_last={k} keeps {k} checkpoints and needs room for one more while saving" if k > 0 else
                "; keep_last=0 keeps every checkpoint")
        return (f"checkpoint step {step}: {what} in {self.root}: {free:,} bytes free, {needs}{keep}. The older "
                "checkpoints are intact. Free space, lower checkpoint.keep_last, or set checkpoint.dir to a larger "
                "disk")

    # ------------------------------------------------------------------ report
    def history(self) -> Dict[str, Any]:
        """For result.json: the branch, its checkpoints on disk (newest first) and those kept off it."""
        on = [os.path.join(self.root, link["name"]) for link in self.ancestry
              if is_link(os.path.join(self.root, link["name"]), link)]
        off = sorted(p for _, p in list_checkpoints(self.root) if p not in on)
        if os.path.isdir(self.root):  # and those a save renamed aside (step_N~<id>)
            off += [os.path.join(self.root, n) for n in sorted(os.listdir(self.root)) if "~" in n]
        return {"branch": self.branch, "dir": self.root, "on_branch": on, "off_branch": off}

    # ------------------------------------------------------------------ resume
    def precheck(self) -> None:
        """Before the trainer is built: an explicit resume path must at least look like a whole checkpoint, written
        at a layout this backend can reshard to this run's."""
        problem = resume_path_problem(self.c.resume, self.backend)
        if problem:
            raise resume_error(os.path.abspath(self.c.resume), problem)
        if self.c.resume not in (None, "", "auto"):
            problem = reshard_problem(self.cfg, read_meta(os.path.abspath(self.c.resume)), self.ctx.world_size)
            if problem:
                raise resume_error(os.path.abspath(self.c.resume), problem)

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
            chain = head_chain(self.root)
            if chain:
                path, skipped = self._latest_valid_on_branch(chain)
            else:  # a dir without history: the newest valid by step
                path, skipped = find_latest_valid(self.root, self.backend)
            for p, why in skipped:
                self.say(f"[primus] checkpoint {p} is not valid ({why}); falling back to the previous one")
            if skipped and path is not None:
                self.say(f"[primus] resume=auto: using {path} (the newest valid checkpoint)")
            if path is None:
                where = "on the current branch " if chain else ""
                self.say(f"[primus] resume=auto: no valid checkpoint {where}in {self.root}; starting from step 1")
                self._start_branch(None)
                return {"path": None, "step": 0, "skipped": skipped} if skipped else None
        else:
            path = os.path.abspath(r)
            problems = verify(path, self.backend)
            if problems:
                raise resume_error(path, f"checkpoint {path}: " + "; ".join(problems))
        meta = read_meta(path)
        rank, world = _rank_world()
        problem = reshard_problem(self.cfg, meta, world)
        if problem:
            raise resume_error(path, problem)
        saved = meta.get("layout")
        if saved is not None and saved != layout_of(self.cfg, world):
            self.say(f"[primus] checkpoint {path} was written at layout {_layout_text(saved)}, this run is "
                     f"{_layout_text(layout_of(self.cfg, world))}: model and optimizer are resharded, the data "
                     f"position continues at the samples consumed")
        elif meta.get("world_size") != world:
            self.say(f"[primus] warning: checkpoint {path} was written by {meta.get('world_size')} ranks, this run "
                     f"has {world}: model/optimizer are resharded, data position and RNG follow rank numbers")
        fp = config_fingerprint(self.cfg)
        if meta.get("config_fingerprint") != fp:
            self.say(f"[primus] warning: checkpoint {path} was written with a different config (fingerprint "
                     f"{meta.get('config_fingerprint')} vs {fp}): model/optimizer settings changed since")
        has = meta.get("contents") or {"optimizer": True, "rng": True}  # older checkpoints held everything
        if not has.get("optimizer", True) and not self.c.no_load_optim:
            raise weights_only_error(path)
        self.trainer.load_checkpoint(path, meta)
        rf = _rng_file(path, rank)
        if os.path.isfile(rf) and not self.c.no_load_rng:
            set_rng_state(load_rng_file(rf))
        kept = [w for w, off in (("optimizer and LR schedule", self.c.no_load_optim),
                                 ("RNG states", self.c.no_load_rng or not has.get("rng", True))) if off]
        if kept:
            self.say(f"[primus] resume: weights loaded; fresh {' and '.join(kept)} (checkpoint.no_load_* / the "
                     "checkpoint's contents)")
        self.ancestry = [entry(path, meta)] + list(meta.get("ancestry") or [])
        self.last_size = sum(int(f["size"]) for f in meta["files"].values())
        self._start_branch(self.ancestry[0])
        self.say(f"[primus] resumed from {path} (step {meta['step']}, branch {self.branch}); "
                 f"next step {meta['step'] + 1}")
        return {"path": path, "step": int(meta["step"]), "trainer_state": meta.get("trainer_state", {}),
                "skipped": skipped, "branch": self.branch,
                "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)}

    def _latest_valid_on_branch(self, chain) -> Tuple[Optional[str], List[Tuple[str, str]]]:
        """The newest valid checkpoint of the current branch (HEAD, then its ancestors), and those skipped."""
        skipped: List[Tuple[str, str]] = []
        for i, link in enumerate(chain):
            path = os.path.join(self.root, link["name"])
            if not os.path.isdir(path):
                if i == 0:
                    skipped.append((path, f"{HEAD_FILE} names it, but it is missing"))
                continue  # pruned by keep_last
            problems = verify(path, self.backend)
            if not problems and not is_link(path, link):
                problems = ["it now holds another branch's checkpoint"]
            if not problems:
                return path, skipped
            skipped.append((path, "; ".join(problems)))
        return None, skipped


def resume_path_problem(resume: Optional[str], backend: str) -> Optional[str]:
    """Why an explicit `checkpoint.resume` path is not a whole checkpoint of this backend (the cheap checks: meta,
    file sizes, backend; the crc32 pass runs at load), or None. Also run by validation, so a dry run says it."""
    if resume in (None, "", "auto"):
        return None
    path = os.path.abspath(resume)
    try:
        meta = read_meta(path)
    except CheckpointError as e:
        return str(e)
    problems = check_sizes(path, meta)
    if meta["backend"] != backend:
        problems.append(f"written by backend {meta['backend']}, this run is backend {backend}")
    return f"checkpoint {path}: " + "; ".join(problems) if problems else None


def layout_of(cfg, world: int) -> Dict[str, Any]:
    from primus.features.parallel import layout_of as of

    return of(cfg, world)


def _layout_text(layout: Dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in layout.items() if v is not None)


def reshard_problem(cfg, meta: Dict[str, Any], world: int) -> Optional[str]:
    """Why the checkpoint of `meta` cannot be resumed at this run's layout (None: it can), asked of the backend
    before anything is loaded. Checkpoints written before layouts were recorded are not checked."""
    saved = meta.get("layout")
    if saved is None:
        return None
    now = layout_of(cfg, world)
    if saved == now:
        return None
    if meta.get("backend") == "torchtitan":
        from primus.backends.torchtitan.checkpoint import reshard_problem as backend_problem
    else:
        from primus.backends.megatron.checkpoint import reshard_problem as backend_problem
    why = backend_problem(cfg, saved, now)
    if why is None:
        return None
    return (f"written at layout {_layout_text(saved)}, this run asks for {_layout_text(now)}: {why}")


def requeued_slurm_job() -> bool:
    """A Slurm job that was requeued (preemption, `scontrol requeue`) runs again with SLURM_RESTART_COUNT >= 1: it
    resumes from its run dir's checkpoints even when checkpoint.resume is null (the pickled submission still says
    what the first attempt was told; the run dir is the same)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0
    except ValueError:
        return False


def resume_error(path: str, msg: str, fix: Optional[str] = None):
    from primus.config.errors import ConfigError, ConfigIssue

    return ConfigError(ConfigIssue(["checkpoint.resume"], path, msg.replace(f"checkpoint {path}: ", "", 1)
                                   if msg.startswith(f"checkpoint {path}: ") else msg,
                                   fix or "point checkpoint.resume at a complete checkpoint dir (step_N with "
                                   f"{META_FILE}), or use checkpoint.resume=auto to take the newest valid one"))


def weights_only_error(path: str):
    return resume_error(path, f"checkpoint {path} holds weights only (saved with checkpoint.no_save_optim=true): it "
                              "has no optimizer or LR scheduler state to resume",
                        fix="set checkpoint.no_load_optim=true to start a fresh optimizer from its weights")


# ----------------------------------------------------------------------------------------------- test hooks

def _maybe_fail_during_save(step: int) -> None:
    """TEST HOOK: PRIMUS_INJECT_SAVE_FAILURE_AT_STEP=N raises after the backend files of step N are written and
    before the checkpoint is committed (stands for a crash mid-save)."""
    v = os.environ.get("PRIMUS_INJECT_SAVE_FAILURE_AT_STEP")
    if v and int(v) == step:
        raise RuntimeError(f"injected failure while saving the checkpoint of step {step} "
                           "(PRIMUS_INJECT_SAVE_FAILURE_AT_STEP)")
