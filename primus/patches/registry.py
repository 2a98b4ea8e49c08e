"""Upstream workarounds as data: what each one works around, the version it was written against, when it applies.

A workaround rebinds something in a library we do not own (megatron-core, TorchTitan, torch, Triton) because that
library, at the version we pin, does something wrong for us: a CUDA-only call on a CPU machine, a NameError without
Transformer Engine, a miscompiled store on ROCm. Each one is a `Workaround` in one registry:

- `primus/backends/megatron/patches/`    megatron-core's (applied by that package's `apply()`, from its trainer);
- `primus/backends/torchtitan/patches/`  TorchTitan's (likewise);
- `primus/patches/`                      torch's and Triton's, shared by every backend.

Rebindings that put primus' own kernels into upstream entry points on a user's request (turbo module swaps, the
Triton RoPE / SwiGLU fusions, the portable fp8 and tuned GEMM linears, compiled layers and losses) are features,
not workarounds: they stay with their feature (turbo.py, fusions.py, fp8.py, tuned_gemm.py, perf.py) and are not
registered here.

Version check. At apply time every workaround compares the installed version of each package it is pinned to
with the pin; the release numbers must start with the pinned ones ("2.13" accepts 2.13.0 and 2.13.1+cpu). On a
mismatch one WARNING names the workaround, the package, the pinned and the installed version, and what happens:

- `on_mismatch="apply"` (the default): it is applied anyway. Chosen where going without it is worse than the risk:
  it makes training possible at all (the CPU redirections), prevents silent wrong results (the ROCm store fix), or
  guards itself at apply time (it rebinds only when it finds the exact upstream object it replaces).
- `on_mismatch="skip"`: it is left out. Chosen where the workaround re-implements upstream logic that a new version
  may have changed and only buys speed: going without it is slower, never wrong. Such an entry says why in
  `mismatch_note`.
"""
from __future__ import annotations

import importlib.metadata
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

log = logging.getLogger("primus.patches")

# torch lines the project runs: 2.11 (+CUDA, the GPU machines) and 2.13 (the CPU build); Triton as requirements.lock
TORCH = ("2.11", "2.13")
TRITON = ("3.6",)

# a package installed under another distribution name on some platforms (ROCm wheels ship Triton as this one)
_ALIASES = {"triton": ("triton", "pytorch-triton-rocm")}


@dataclass
class Conditions:
    """What a workaround's `applies` predicate may look at: the run's device, whether torch is a ROCm build, and
    the backend's resolved arguments (megatron's build_args dict; empty where a backend has none to give)."""

    device: str = "cpu"
    rocm: bool = False
    args: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workaround:
    name: str  # "<backend>.<concern>.<what>", unique
    upstream: str  # the upstream module / function / attribute it works around
    problem: str  # what goes wrong there without it
    pinned: Tuple[Tuple[str, Tuple[str, ...]], ...]  # (distribution, accepted release prefixes) pairs
    when: str  # when it applies, in words (mirrors `applies`)
    applies: Callable[[Conditions], bool]
    fix: Callable[[Conditions], Any]  # does it; its return value is kept in the apply() result
    every_run: bool = False  # re-run on every apply (idempotent, per-run state); else once per process
    on_mismatch: str = "apply"  # "apply" | "skip" (see the module doc)
    mismatch_note: str = ""  # why "skip" is the safe choice

    def __post_init__(self):
        if self.on_mismatch not in ("apply", "skip"):
            raise ValueError(f"workaround {self.name}: on_mismatch={self.on_mismatch!r}, allowed: 'apply', 'skip'")
        if self.on_mismatch == "skip" and not self.mismatch_note:
            raise ValueError(f"workaround {self.name}: on_mismatch='skip' needs a mismatch_note saying why")
        if not self.pinned:
            raise ValueError(f"workaround {self.name}: no pinned version")

    def pins(self) -> str:
        return ", ".join(f"{dist} {' or '.join(vs)}" for dist, vs in self.pinned)


def pin(dist: str, *versions: str) -> Tuple[str, Tuple[str, ...]]:
    return dist, tuple(versions)


def installed_version(dist: str) -> Optional[str]:
    for name in _ALIASES.get(dist, (dist,)):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> Tuple[int, ...]:
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def version_matches(installed: Optional[str], pinned: Iterable[str]) -> bool:
    if installed is None:
        return False
    have = _release(installed)
    return any(have[:len(_release(p))] == _release(p) for p in pinned)


def mismatches(w: Workaround) -> List[Tuple[str, str, Optional[str]]]:
    """(distribution, pinned, installed) for each pin the installed packages do not meet."""
    out = []
    for dist, versions in w.pinned:
        have = installed_version(dist)
        if not version_matches(have, versions):
            out.append((dist, " or ".join(versions), have))
    return out


def mismatch_message(w: Workaround, found: List[Tuple[str, str, Optional[str]]]) -> str:
    vs = "; ".join(f"{dist}: pinned {want}, installed {have or 'none'}" for dist, want, have in found)
    what = ("applied anyway: check it still holds" if w.on_mismatch == "apply"
            else f"NOT applied ({w.mismatch_note})")
    return (f"upstream workaround {w.name} was written against another version ({vs}); {what}. "
            f"It works around {w.upstream}: {w.problem}")


_APPLIED: set = set()  # once-per-process workarounds already applied
_WARNED: set = set()  # one version warning per workaround and process


def apply_all(workarounds: Iterable[Workaround], cond: Conditions) -> Dict[str, Any]:
    """Apply, in order, every workaround whose `applies(cond)` holds; returns {name: what its fix returned}."""
    done: Dict[str, Any] = {}
    for w in workarounds:
        if not w.applies(cond):
            continue
        found = mismatches(w)
        if found and w.name not in _WARNED:
            _WARNED.add(w.name)
            log.warning(mismatch_message(w, found))
        if found and w.on_mismatch == "skip":
            continue
        if w.every_run or w.name not in _APPLIED:
            done[w.name] = w.fix(cond)
            _APPLIED.add(w.name)
        else:
            done[w.name] = None
    return done


def describe(workarounds: Iterable[Workaround]) -> List[Dict[str, str]]:
    """One row per workaround (name, upstream, problem, pinned, installed, when, on_mismatch), e.g. for a listing."""
    rows = []
    for w in workarounds:
        rows.append({"name": w.name, "upstream": w.upstream, "problem": w.problem, "pinned": w.pins(),
                     "installed": ", ".join(f"{d} {installed_version(d) or 'none'}" for d, _ in w.pinned),
                     "when": w.when, "on_mismatch": w.on_mismatch})
    return rows
