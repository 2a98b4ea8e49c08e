"""Run as a script (no TRITON_INTERPRET): fp8_cast_gluon's kernel through Triton's full pipeline for sm90 on the CPU
(Gluon -> TTGIR -> PTX -> cubin with the ptxas Triton ships), and what its SASS holds.

Prints one JSON object {case: {"regs", "stack", "lds", "lds_u8", "instructions"} | error text}: registers per
thread, spill stack bytes, shared-memory loads (all; byte-wide) and instructions per thread. The kernel exists to
transpose in registers: its only shared-memory loads are the cross-warp steps of its amax reductions, none
byte-wide; the Triton kernel it stands in for (fp8_linear._cast_block, both 1x128 outputs) is compiled too, as the
control that transposes through shared memory byte by byte. Used by tests/test_turbo_frontend_compile.py.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from primus.turbo import fp8_cast_gluon as G  # noqa: E402
from primus.turbo import fp8_linear as F8  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def read(src, num_warps) -> dict:
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)", res)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    return {"regs": int(m.group(1)), "stack": int(m.group(2)), "lds": sum(o.startswith("LDS") for o in ops),
            "lds_u8": sum(o.startswith("LDS.U8") for o in ops), "instructions": len(ops)}


def attrs(fn, sig):  # the divisible-by-16 hints a launch attaches to Llama-shaped arguments
    return {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, t in sig.items()
            if t.startswith("*") or t == "i32"}


def cases():
    from triton.experimental.gluon._runtime import GluonASTSource

    for x in ("*bf16", "*fp16"):
        for q in ("*fp8e4nv", "*fp8e5"):
            sig = {"X": x, "Y": q, "YT": q, "S": "*fp32", "ST": "*fp32", "R": "i32", "C": "i32", "RP": "i32",
                   "stride_xr": "i32", "s_sr": "i32", "s_sc": "i32", "s_tr": "i32", "s_tc": "i32", "FP8_MAX": "fp32"}
            ce = {"BR": G.BR, "BC": G.BC}
            yield (f"gluon {x[1:]} -> {q[1:]}", G.NUM_WARPS,
                   GluonASTSource(fn=G._cast_both_1x128, signature={**sig, **{k: "constexpr" for k in ce}},
                                  constexprs=ce, attrs=attrs(G._cast_both_1x128, sig)))
    sig = {"X": "*bf16", "Y": "*fp8e4nv", "YT": "*fp8e4nv", "S": "*fp32", "ST": "*fp32", "R": "i32", "C": "i32",
           "RP": "i32", "stride_xr": "i32", "s_sr": "i32", "s_sc": "i32", "s_tr": "i32", "s_tc": "i32",
           "SPAD": "i32", "STPAD": "i32", "FP8_MAX": "fp32"}
    ce = {"stride_xc": 1, "BR": 128, "BC": 128, "TILE": False, "WRITE_Y": True, "WRITE_T": True, "SAT": True}
    yield ("triton control", 8, ASTSource(fn=F8._cast_block, signature={**sig, **{k: "constexpr" for k in ce}},
                                          constexprs=ce, attrs=attrs(F8._cast_block, sig)))


if __name__ == "__main__":
    out = {}
    for name, warps, src in cases():
        try:
            out[name] = read(src, warps)
        except Exception as e:  # noqa: BLE001 - reported per case
            out[name] = f"{type(e).__name__}: {str(e)[-300:]}"
    print(json.dumps(out))
