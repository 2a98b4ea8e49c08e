"""What tuning one problem produced, and the append-only journal that makes a tuning run resumable.

The journal (`<results file>.progress.jsonl`) gets one line per finished problem, written after that problem's
results row: a killed run restarts with the problems missing from it. The report is built from it too, since it
also keeps the problems that stayed on the default algorithm (which get no results row).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

# status values
TUNED = "tuned"        # a faster algorithm was found and written to the results file
DEFAULT = "default"    # nothing beat the default by the required margin: training keeps the default
SKIPPED = "skipped"    # this backend cannot tune that problem (e.g. fp8 on the CUDA path)
FAILED = "failed"      # an error; the detail says which


@dataclass
class TuneOutcome:
    status: str
    default_us: float | None = None
    tuned_us: float | None = None
    row: dict | None = None             # results-file row (TUNED only)
    git_version: str | None = None      # the results file's first line, from the backend that tuned it
    candidates: int = 0
    rejected: int = 0
    detail: str = ""
    device: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TuneOutcome":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class JournalEntry:
    key: list
    label: str
    count: float
    outcome: TuneOutcome = field(default_factory=lambda: TuneOutcome(FAILED))


def journal_path(results_file: Path | str) -> Path:
    return Path(str(results_file) + ".progress.jsonl")


def read_journal(path: Path | str) -> dict[tuple, JournalEntry]:
    """Finished problems by tune key (a later line wins). A torn last line from a kill is ignored."""
    out: dict[tuple, JournalEntry] = {}
    path = Path(path)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        key = _as_tuple(d["key"])
        out[key] = JournalEntry(key=d["key"], label=d.get("label", ""), count=d.get("count", 1.0),
                                outcome=TuneOutcome.from_dict(d.get("outcome", {"status": FAILED})))
    return out


def _as_tuple(v):
    return tuple(_as_tuple(x) for x in v) if isinstance(v, list) else v


def append_journal(path: Path | str, key: tuple, label: str, count: float, outcome: TuneOutcome) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"key": list(key), "label": label, "count": count, "outcome": outcome.to_dict()})
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
