"""`python -m primus.patches`: every registered upstream workaround with the upstream behaviour it works around,
its pinned and installed versions and when it applies; exits 1 when an installed version differs from a pin."""
from __future__ import annotations

import sys
from typing import List, Optional


def all_workarounds():
    from primus.backends.megatron.patches import WORKAROUNDS as megatron
    from primus.backends.torchtitan.patches import WORKAROUNDS as torchtitan
    from primus.patches import WORKAROUNDS as shared

    return megatron + torchtitan + shared


def main(argv: Optional[List[str]] = None) -> int:
    from primus.patches.registry import describe, mismatches

    if argv:
        print("usage: python -m primus.patches", file=sys.stderr)
        return 2
    found = 0
    workarounds = all_workarounds()
    for w, row in zip(workarounds, describe(workarounds)):
        off = mismatches(w)
        found += bool(off)
        print(f"{row['name']}{'  [VERSION MISMATCH]' if off else ''}\n"
              f"  upstream:    {row['upstream']}\n  problem:     {row['problem']}\n"
              f"  pinned:      {row['pinned']}\n  installed:   {row['installed']}\n"
              f"  when:        {row['when']}\n  on mismatch: {row['on_mismatch']}\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
