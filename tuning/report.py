"""Tuning report: per problem default vs tuned time, and the call-count-weighted GEMM time of one step."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuning.gemm_problem import GemmProblem
from tuning.tune_journal import TUNED, JournalEntry


@dataclass
class ReportLine:
    label: str
    count: float
    status: str
    default_us: float | None
    tuned_us: float | None      # what training will run: the tuned time, or the default when kept
    detail: str = ""

    @property
    def speedup(self) -> float | None:
        if self.default_us and self.tuned_us:
            return self.default_us / self.tuned_us
        return None


@dataclass
class Report:
    lines: list[ReportLine] = field(default_factory=list)

    @property
    def timed(self) -> list[ReportLine]:
        return [r for r in self.lines if r.default_us and r.tuned_us]

    @property
    def step_default_us(self) -> float:
        return sum(r.count * r.default_us for r in self.timed)

    @property
    def step_tuned_us(self) -> float:
        return sum(r.count * r.tuned_us for r in self.timed)

    @property
    def step_speedup(self) -> float | None:
        return self.step_default_us / self.step_tuned_us if self.step_tuned_us else None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.lines:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def markdown(self) -> str:
        head = ("| GEMM (cuBLAS terms) | calls/step | status | default us | tuned us | speedup |\n"
                "|---|---:|---|---:|---:|---:|")
        rows = []
        for r in self.lines:
            f = lambda v: f"{v:.2f}" if v else "-"  # noqa: E731
            sp = f"{r.speedup:.3f}x" if r.speedup else "-"
            rows.append(f"| {r.label} | {r.count:g} | {r.status} | {f(r.default_us)} | {f(r.tuned_us)} | {sp} |")
        sp = self.step_speedup
        total = (f"\nWeighted GEMM time of one step: default {self.step_default_us / 1e3:.3f} ms, tuned "
                 f"{self.step_tuned_us / 1e3:.3f} ms, speedup {sp:.3f}x" if sp else "\nNo timed problems.")
        return "\n".join([head] + rows) + "\n" + total + f"\nProblems by status: {self.counts()}\n"

    def to_json(self) -> dict:
        return {"lines": [asdict(r) | {"speedup": r.speedup} for r in self.lines],
                "step_default_us": self.step_default_us, "step_tuned_us": self.step_tuned_us,
                "step_speedup": self.step_speedup, "status_counts": self.counts()}

    def write(self, stem: Path | str) -> tuple[Path, Path]:
        stem = Path(stem)
        md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
        md.write_text(self.markdown())
        js.write_text(json.dumps(self.to_json(), indent=1))
        return md, js


def build_report(problems: list[GemmProblem], journal: dict[tuple, JournalEntry]) -> Report:
    rep = Report()
    for p in problems:
        e = journal.get(p.tune_key())
        if e is None:
            rep.lines.append(ReportLine(p.label(), p.count, "pending", None, None))
            continue
        o = e.outcome
        tuned = o.tuned_us if o.status == TUNED else o.default_us
        rep.lines.append(ReportLine(p.label(), p.count, o.status, o.default_us, tuned, o.detail))
    return rep
