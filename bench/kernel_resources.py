"""Registers and spill stack of the turbo kernels' launch configs on sm90, read on the CPU (no GPU, no device time).

    python bench/kernel_resources.py [--only blockwise_cast,swiglu_fwd,...]

Compiles each config through Triton's full pipeline for an sm90 target (TTIR -> TTGIR -> LLVM -> PTX -> cubin, with
the ptxas that Triton ships) and reads the cubin's resource usage with Triton's cuobjdump: registers per thread and
the stack frame (bytes per thread spilled to local memory). What METHOD.md calls reading what costs no device time:
a memory-bound kernel whose config needs 255 registers runs one CTA per SM, and a spill stack adds local-memory
traffic to every element. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from primus.turbo import rmsnorm as RN  # noqa: E402
from primus.turbo import swiglu as SW  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resources(fn, signature: dict, constexprs: dict, num_warps: int, aligned: bool = True) -> dict:
    """aligned: every pointer and integer argument carries the divisible-by-16 hint a real launch attaches when the
    value is a multiple of 16 (Llama shapes: all of them); without it loads and stores compile to scalar accesses,
    a different kernel from the one that runs. A stride of 1 is specialised by a launch too: pass it in
    `constexprs`."""
    sig = {**signature, **{k: "constexpr" for k in constexprs}}
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, t in signature.items()
             if aligned and (t.startswith("*") or t == "i32")}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        out = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)", out)
    if not m:
        raise RuntimeError(f"no resource line in cuobjdump's output: {out[-500:]}")
    return {"regs": int(m.group(1)), "stack": int(m.group(2))}


def configs():
    """(kernel, case, fn, signature, constexprs, num_warps) for every config of the tuned spaces looked at here."""
    cb = {"X": "*bf16", "Y": "*fp8e4nv", "YT": "*fp8e4nv", "S": "*fp32", "ST": "*fp32", "R": "i32", "C": "i32",
          "RP": "i32", "stride_xr": "i32", "s_sr": "i32", "s_sc": "i32", "s_tr": "i32",
          "s_tc": "i32", "SPAD": "i32", "STPAD": "i32", "FP8_MAX": "fp32"}  # stride_xc: 1, a constexpr below
    for tile, wy, wt, case in ((False, True, False, "x 1x128"), (False, False, True, "x^T 1x128"),
                               (False, True, True, "dy and dy^T 1x128"), (True, True, True, "W and W^T 128x128")):
        for c in F8._CAST_BLOCK.space(TILE=tile, WRITE_Y=wy, WRITE_T=wt):
            yield ("blockwise_cast", case, F8._cast_block, cb,
                   {"stride_xc": 1, "BR": c["BR"], "BC": c["BC"], "TILE": tile, "WRITE_Y": wy, "WRITE_T": wt,
                    "SAT": True},
                   c["num_warps"])
    sw = {"H": "*bf16", "P": "*fp32", "Y": "*bf16", "N": "i32", "F": "i32", "s_h": "i32"}
    for c in SW._FWD.configs:
        yield "swiglu_fwd", "no probs", SW._swiglu_fwd, sw, {"HAS_P": False, "BLOCK": c["BLOCK"]}, c["num_warps"]
    ct = {"X": "*bf16", "AMAX": "*fp32", "Y": "*fp8e4nv", "SINV": "*fp32", "R": "i32", "C": "i32", "YR": "i32",
          "YC": "i32", "stride_xr": "i32", "FP8_MAX": "fp32"}
    for c in F8._COLS_T.configs:
        yield "rowwise_cast_t", "x^T per column", F8._cast_cols_t, ct, {"BM": c["BM"], "BK": c["BK"]}, \
            c["num_warps"]
    rn = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32", "M": "i32", "N": "i32", "stride_x": "i32",
          "stride_y": "i32", "eps": "fp32"}
    for c in RN._FWD.space(BLOCK_N=4096):
        yield "rmsnorm_fwd", "hidden 4096", RN._rmsnorm_fwd, rn, {"BLOCK_M": c["BLOCK_M"], "BLOCK_N": 4096}, \
            c["num_warps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma list of kernel names (blockwise_cast, swiglu_fwd, ...)")
    only = {s for s in ap.parse_args().only.split(",") if s}
    print("| kernel | case | config | warps | registers | stack (B/thread) |\n|---|---|---|---:|---:|---:|")
    for kernel, case, fn, sig, consts, warps in configs():
        if only and kernel not in only:
            continue
        r = resources(fn, sig, consts, warps)
        cfg = " ".join(f"{k}={v}" for k, v in consts.items() if k.startswith("B"))
        print(f"| {kernel} | {case} | {cfg} | {warps} | {r['regs']} | {r['stack']} |", flush=True)


if __name__ == "__main__":
    main()
