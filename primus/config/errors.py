"""The one error type for a bad config: it names the key(s), the value, the rule and the fix.

An issue has a severity. "error" stops the run. "warning" is a setting that is harmless where it does not apply
(a MoE flag on a dense model, as Primus treats it): the run goes on, the warning is logged and listed in
result.json's `ignored_settings`. An error that only says a library is missing on this machine (`needs`:
Transformer Engine, DeepEP, primus_turbo) does not stop a dry run judged for the GPU target: it is listed there as
needed on the target.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

ERROR, WARNING, NOTE = "error", "warning", "note"  # NOTE: a value one setting implies for another


@dataclass
class ConfigIssue:
    keys: Sequence[str]  # dotted config keys involved, e.g. ["turbo.use_turbo_deepep", "turbo.enable_primus_turbo"]
    value: Any  # the offending value (or a dict of values)
    rule: str  # what is required
    fix: str  # how to fix it
    severity: str = ERROR  # ERROR, WARNING or NOTE
    needs: Optional[str] = None  # the library this machine lacks, when that is all that is wrong

    def __str__(self) -> str:
        keys = ", ".join(self.keys)
        return f"{keys} = {self.value!r}: {self.rule}" + (f". Fix: {self.fix}" if self.fix else "")

    def as_ignored(self) -> Dict[str, Any]:
        """result.json's `ignored_settings` entry of a warning."""
        return {"key": ", ".join(self.keys), "value": self.value, "why": self.rule}

    def as_needed(self) -> Dict[str, Any]:
        """A dry run's `needed_on_target` entry."""
        return {"key": ", ".join(self.keys), "value": self.value, "needs": self.needs, "why": self.rule}


def note(keys: Sequence[str], value: Any, rule: str) -> ConfigIssue:
    return ConfigIssue(list(keys), value, rule, "", severity=NOTE)


def warning(keys: Sequence[str], value: Any, rule: str, fix: str) -> ConfigIssue:
    return ConfigIssue(list(keys), value, rule, fix, severity=WARNING)


class ConfigError(ValueError):
    """Raised before any work starts; carries every issue found, not only the first."""

    def __init__(self, issues: Union[ConfigIssue, List[ConfigIssue]]):
        self.issues = [issues] if isinstance(issues, ConfigIssue) else list(issues)
        lines = [f"  - {i}" for i in self.issues]
        super().__init__("invalid config (%d problem%s):\n%s" % (
            len(self.issues), "" if len(self.issues) == 1 else "s", "\n".join(lines)))
