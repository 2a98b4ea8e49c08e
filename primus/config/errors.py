"""The one error type for a bad config: it names the key(s), the value, the rule and the fix."""
from dataclasses import dataclass
from typing import Any, List, Sequence, Union


@dataclass
class ConfigIssue:
    keys: Sequence[str]  # dotted config keys involved, e.g. ["turbo.use_turbo_deepep", "turbo.enable_primus_turbo"]
    value: Any  # the offending value (or a dict of values)
    rule: str  # what is required
    fix: str  # how to fix it

    def __str__(self) -> str:
        keys = ", ".join(self.keys)
        return f"{keys} = {self.value!r}: {self.rule}. Fix: {self.fix}"


class ConfigError(ValueError):
    """Raised before any work starts; carries every issue found, not only the first."""

    def __init__(self, issues: Union[ConfigIssue, List[ConfigIssue]]):
        self.issues = [issues] if isinstance(issues, ConfigIssue) else list(issues)
        lines = [f"  - {i}" for i in self.issues]
        super().__init__("invalid config (%d problem%s):\n%s" % (
            len(self.issues), "" if len(self.issues) == 1 else "s", "\n".join(lines)))
