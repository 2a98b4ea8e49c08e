"""One run per directory: an exclusive lock on a run dir or checkpoint dir, held for the run's life.

Two runs writing one checkpoint dir destroy each other's saves (each save starts by clearing leftover `.tmp-*`
dirs, which are the other run's save in progress) and overwrite each other's result.json. That happens on a double
submission, or when two runs are given the same `checkpoint.dir`. So the process that owns the run takes
`<dir>/.primus.lock` first and a second run on the same dir is refused, naming the holder.

The lock is `flock(2)` on the file, so it dies with its process: a lock left by a killed run is free, and taking it
over says whose it was (the file keeps the last holder's pid, host and start time). flock works across the nodes of
a cluster on NFSv4 and Lustre, where run dirs of multi-node jobs live.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Callable, Dict, List, Optional

LOCK_FILE = ".primus.lock"


class DirLocked(RuntimeError):
    """Another live process holds the lock: the message names the dir and the holder."""

    def __init__(self, path: str, holder: Dict[str, object]):
        self.path, self.holder = path, holder
        super().__init__(f"{path} is in use by pid {holder.get('pid', '?')} on host {holder.get('host', '?')} "
                         f"(since {holder.get('since', '?')})")


class DirLock:
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.file = os.path.join(self.path, LOCK_FILE)
        self._fd: Optional[int] = None
        self.took_over: Optional[Dict[str, object]] = None  # the previous holder, when its process had died

    def acquire(self) -> "DirLock":
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise DirLocked(self.path, holder) from None
        self.took_over = _read(fd) or None  # a holder recorded but not holding: its process ended without release
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty file = released cleanly (a later taker has no one to report)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _read(fd: int) -> Dict[str, object]:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}


def lock_dirs(dirs: Dict[str, str], say: Callable[[str], None] = print) -> List[DirLock]:
    """Lock each dir ({what: path}, e.g. {"run dir": ..., "checkpoint.dir": ...}; the same path once). A held one
    raises ConfigError naming it and its holder, after releasing what this call took."""
    from primus.config.errors import ConfigError, ConfigIssue

    held: List[DirLock] = []
    seen = set()
    for what, path in dirs.items():
        path = os.path.abspath(path)
        if path in seen:
            continue
        seen.add(path)
        try:
            lock = DirLock(path).acquire()
        except DirLocked as e:
            for h in held:
                h.release()
            raise ConfigError(ConfigIssue([what], path, f"another run is using this dir: {e}",
                                          "wait for that run to end (or stop it), or give this run its own dir"
                                          )) from None
        if lock.took_over:
            o = lock.took_over
            say(f"[primus] {path}: took over the lock of pid {o.get('pid')} on host {o.get('host')} "
                f"(since {o.get('since')}), which ended without releasing it")
        held.append(lock)
    return held
