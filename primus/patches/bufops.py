"""Find buffer stores whose data VGPRs are redefined before the store is known complete.

Pure text analysis of AMDGCN assembly; no torch/triton import, so the audit CLI
runs anywhere.  The rule (see docs/rocm-bufops.md):

* Exposed stores: ``buffer_store_*`` / ``tbuffer_store_*`` whose data operand spans
  more than two VGPRs (> 64 bits: dwordx3, dwordx4, b96, b128, format_xyz[w]).
  That is the width class LLVM's own hazard recognizer singles out (VMEM stores of
  more than 8 bytes read their data late), and it is the class Triton emits in the
  miscompiled kernels.  dwordx2/b64 and narrower are deliberately not flagged:
  flagging them would send clean kernels (e.g. GEMM epilogues) to the slower
  no-buffer-ops path for no known benefit.  Global/flat stores are out of scope on
  purpose: disabling buffer ops turns buffer stores into global stores, so counting
  those would make the fix unverifiable.
* Walking forward from the store, a wait protects it once it guarantees the store
  has completed; an instruction writing an overlapping VGPR first is a hazard.
* Control flow (branches, returns, s_endpgm, branch-target labels) ends the walk
  without a report: the observed defect is straight-line, and cross-block waits
  are tracked by the compiler's own merge logic.  Reporting there would flag most
  looping kernels and defeat per-kernel selection.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

__all__ = ["Hazard", "Instr", "parse", "find_hazards", "main"]


@dataclass(frozen=True)
class Instr:
    line: int  # 1-based line number in the input text
    text: str  # instruction without comment
    mnemonic: str
    operands: tuple[str, ...]


@dataclass(frozen=True)
class Hazard:
    store_line: int
    store: str
    clobber_line: int
    clobber: str
    registers: tuple[int, int]  # overlapping VGPRs, inclusive

    def __str__(self) -> str:
        lo, hi = self.registers
        regs = f"v{lo}" if lo == hi else f"v[{lo}:{hi}]"
        return (f"line {self.store_line}: {self.store}  <- data {regs} redefined at "
                f"line {self.clobber_line}: {self.clobber}")


_LABEL = re.compile(r"^([A-Za-z_.$][\w.$]*):")
_VREG = re.compile(r"^v(?:\[(\d+)(?::(\d+))?\]|(\d+))$")
_VMEM = re.compile(r"^(buffer|tbuffer|global|scratch)_(load|store|atomic)")
_STORE_COUNTED = re.compile(r"^(buffer|tbuffer|global|scratch)_store")
_EXPOSED_STORE = re.compile(r"^t?buffer_store_")
_NO_VGPR_DEST = re.compile(
    r"^(t?buffer_store|global_store|flat_store|scratch_store|image_store|ds_write|ds_store"
    r"|v_cmpx|exp\b|s_)"
)
_CONTROL_FLOW = re.compile(r"^s_(branch|cbranch\w*|setpc\w*|swappc\w*|call\w*|endpgm\w*|rfe\w*|trap)$")
_COUNTER = re.compile(r"(\w+)\((\d+)\)")
_RETURNING = re.compile(r"\b(glc|sc0|th:TH_ATOMIC_RETURN)\b")
_DS_RETURNS = re.compile(r"read|load|rtn|swizzle|permute|append|consume|bvh")
_SPLIT_TARGET = re.compile(r"gfx1\d{3}")  # gfx10/11/12 and later: stores have their own counter


def _strip_comment(line: str) -> str:
    for mark in (";", "//"):
        cut = line.find(mark)
        if cut >= 0:
            line = line[:cut]
    return line.strip()


def _split_operands(rest: str) -> tuple[str, ...]:
    # Commas inside brackets (dpp quad_perm:[0,1,2,3]) are not operand separators.
    ops, depth, cur = [], 0, []
    for ch in rest:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            ops.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        ops.append("".join(cur).strip())
    return tuple(ops)


def parse(asm: str) -> tuple[list[Instr | str], set[str]]:
    """Instructions and label names (as str items) in order, plus the branch-target names."""
    items: list[Instr | str] = []
    targets: set[str] = set()
    for n, raw in enumerate(asm.splitlines(), 1):
        text = _strip_comment(raw)
        while (m := _LABEL.match(text)):
            items.append(m.group(1))
            text = text[m.end():].strip()
        if not text or text.startswith("."):
            continue
        # VOPD dual-issue halves are independent instructions sharing one line.
        for half in text.split("::"):
            half = half.strip()
            mnemonic, _, rest = half.partition(" ")
            ins = Instr(n, half, mnemonic.lower(), _split_operands(rest.strip()))
            items.append(ins)
            if _CONTROL_FLOW.match(ins.mnemonic) and ins.operands:
                targets.add(ins.operands[0].split()[0])
    return items, targets


def vgpr_range(operand: str) -> tuple[int, int] | None:
    m = _VREG.match(operand.split()[0]) if operand else None
    if not m:
        return None
    if m.group(3) is not None:
        lo = hi = int(m.group(3))
    else:
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
    return lo, hi


def written_vgprs(ins: Instr) -> list[tuple[int, int]]:
    """VGPR ranges an instruction writes.  AGPRs (a[..]) are a separate file and never count."""
    mn, ops = ins.mnemonic, ins.operands
    if not ops or _NO_VGPR_DEST.match(mn):
        return []
    if re.match(r"^(buffer|global|flat|scratch|image)_load", mn) and re.search(r"\blds\b|_lds_", ins.text):
        return []  # direct-to-LDS load: the first operand is an address, not a destination
    if re.match(r"^(buffer|global|flat|scratch|image)_atomic", mn) and not _RETURNING.search(ins.text):
        return []  # non-returning atomic: first operand is address/data
    if mn.startswith("ds_") and not _DS_RETURNS.search(mn):
        return []
    dests = ops[:2] if re.match(r"^v_(swap|swaprel|permlane\w*_swap)", mn) else ops[:1]
    return [r for r in map(vgpr_range, dests) if r]


def _waits(ins: Instr) -> dict[str, int]:
    """Counter -> limit for a wait instruction; empty if it is not one."""
    mn, ops = ins.mnemonic, ins.operands
    if mn == "s_waitcnt":
        found = {k: int(v) for k, v in _COUNTER.findall(ins.text)}
        if not found and ops and ops[0].strip() in ("0", "0x0"):
            return {"vmcnt": 0, "expcnt": 0, "lgkmcnt": 0}  # raw zero immediate: everything drained
        return found
    if mn == "s_waitcnt_vscnt" and len(ops) == 2 and ops[0] in ("null", "sgpr_null"):
        return {"vscnt": int(ops[1], 0)}
    if mn == "s_wait_storecnt" and ops:
        return {"vscnt": int(ops[0], 0)}
    if mn == "s_wait_idle":
        return {"vmcnt": 0, "vscnt": 0}
    return {}


def _split_counters(asm: str) -> bool:
    # Decided from the code itself: a gfx10+ target directive or any store-counter wait.
    return bool(_SPLIT_TARGET.search(asm) or re.search(r"s_waitcnt_vscnt|s_wait_storecnt", asm))


def find_hazards(asm: str, split_store_counter: bool | None = None) -> list[Hazard]:
    """Every exposed buffer store whose data VGPRs are redefined before a protecting wait.

    Protection rule (in-order completion within one counter): a wait ``cnt(N)`` lets
    at most N ops of that counter stay outstanding, and those are the N youngest.  If
    k ops on the same counter were issued after the store, the store is guaranteed
    complete iff N <= k.  On gfx9 that counter is vmcnt (loads and stores share it);
    on gfx10+ stores use vscnt/storecnt, so vmcnt waits and loads neither protect
    nor count there.  Waits on other counters only (lgkmcnt, expcnt) never protect.
    Flat ops (which may resolve to LDS), image ops and, on gfx10+, atomics are not
    counted: under-counting k can only make the rule stricter.
    """
    split = _split_counters(asm) if split_store_counter is None else split_store_counter
    counter = "vscnt" if split else "vmcnt"
    counted = _STORE_COUNTED if split else _VMEM
    items, targets = parse(asm)
    hazards: list[Hazard] = []
    for i, store in enumerate(items):
        if not isinstance(store, Instr) or not _EXPOSED_STORE.match(store.mnemonic):
            continue
        data = vgpr_range(store.operands[0]) if store.operands else None
        if data is None or data[1] - data[0] + 1 <= 2:
            continue
        issued_after = 0
        for ins in items[i + 1:]:
            if isinstance(ins, str):
                if ins in targets:
                    break  # join point: unknown predecessor state, stop without reporting
                continue
            limit = _waits(ins).get(counter)
            if limit is not None and limit <= issued_after:
                break  # store complete: protected
            hit = _overlap(data, written_vgprs(ins))
            if hit:
                hazards.append(Hazard(store.line, store.text, ins.line, ins.text, hit))
                break
            if _CONTROL_FLOW.match(ins.mnemonic):
                break
            if counted.match(ins.mnemonic):
                issued_after += 1
    return hazards


def _overlap(data: tuple[int, int], writes: list[tuple[int, int]]) -> tuple[int, int] | None:
    for lo, hi in writes:
        a, b = max(lo, data[0]), min(hi, data[1])
        if a <= b:
            return a, b
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] != "check":
        print("usage: python -m primus.patches.bufops check FILE...", file=sys.stderr)
        return 2
    found, unreadable = 0, False
    for path in argv[1:]:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            print(f"{path}: cannot read: {e.strerror or e}", file=sys.stderr)
            unreadable = True
            continue
        for h in find_hazards(text):
            found += 1
            print(f"{path}:{h.store_line}: {h.store}  clobbered at {path}:{h.clobber_line}: {h.clobber}")
    if unreadable:
        return 2
    print(f"{found} hazard(s)" if found else "no hazards", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
