"""Estimate vs measured peak memory, from finished runs' result.json (config + torch.cuda.max_memory_allocated).

    python -m primus.plan.compare outputs/runs/<dir> [<dir> ...]      # prints the markdown rows for docs/planning.md
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional


def row(result: Dict[str, Any], label: Optional[str] = None) -> Dict[str, Any]:
    from omegaconf import OmegaConf

    from primus.config.schema import PrimusConfig
    from primus.plan.gpus import GiB, resolve_gpu
    from primus.plan.memory import estimate_memory

    cfg: PrimusConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrimusConfig), result["config"]))
    world = int((result.get("resolved") or {}).get("world_size") or 1)
    mem = result.get("memory") or {}
    total = mem.get("device_total_gib")
    gpu = resolve_gpu("H200", total)
    bd = estimate_memory(cfg, gpu, world)
    est = bd.total / GiB
    meas = mem.get("max_allocated_gib")
    return {"config": label or " ".join((result.get("overrides") or [])) or cfg.model.name,
            "backend": cfg.backend.name.value, "estimate_gib": est, "measured_gib": meas,
            "reserved_gib": mem.get("max_reserved_gib"), "status": result.get("status"),
            "error_pct": None if not meas else 100.0 * (est - meas) / meas}


def markdown(rows: List[Dict[str, Any]]) -> str:
    out = ["| config | backend | estimate (GiB) | measured max allocated (GiB) | reserved (GiB) | error |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        m = "-" if r["measured_gib"] is None else f"{r['measured_gib']:.2f}"
        res = "-" if r["reserved_gib"] is None else f"{r['reserved_gib']:.2f}"
        e = "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
        out.append(f"| `{r['config']}` | {r['backend']} | {r['estimate_gib']:.2f} | {m} | {res} | {e} |")
    return "\n".join(out)


def main(argv: List[str]) -> int:
    rows = []
    for d in argv:
        path = d if d.endswith(".json") else os.path.join(d, "result.json")
        with open(path) as f:
            rows.append(row(json.load(f)))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
