"""Run as a script (no TRITON_INTERPRET): Triton's front end (AST -> TTIR) for sm90 on the kernels the GPU may launch.

Prints one JSON object {check name: "ok" | error text}. Used by tests/test_turbo_frontend_compile.py, in its own
process because under TRITON_INTERPRET=1 (the CPU tests) @triton.jit yields interpreter objects, not compilable ones.
"""
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402

from primus.turbo import fp8_linear as F8  # noqa: E402
from primus.turbo import grouped_gemm as GG  # noqa: E402
from primus.turbo import grouped_gemm_fp8 as GF  # noqa: E402
from primus.turbo import moe_ops as MO  # noqa: E402
from primus.turbo import rmsnorm as RN  # noqa: E402
from primus.turbo import rope as RP  # noqa: E402
from primus.turbo import swiglu as SW  # noqa: E402


def ttir(fn, signature, constexprs) -> str:
    from triton._C.libtriton import ir

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    opts = backend.parse_options({})
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    src = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return str(src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), ctx))


@triton.jit
def _mismatched(X, n, B: tl.constexpr):  # runs in the interpreter, must not compile
    o = tl.arange(0, B)
    if n == 1:
        x = tl.load(X + o).to(tl.float32)
    else:
        x = tl.load(X + o)
    tl.store(X + o, x)


def checks():
    yield "mismatched branch types (must fail)", _mismatched, {"X": "*bf16", "n": "i32"}, {"B": 16}
    rowwise = {"X": "*bf16", "Y": "*fp8e4nv", "SINV": "*fp32", "R": "i32", "C": "i32", "RP": "i32", "CP": "i32",
               "stride_xr": "i32", "stride_xc": "i32", "stride_yr": "i32", "stride_yc": "i32", "FP8_MAX": "fp32"}
    for cfg in F8._ROWWISE_ROWS.configs:
        yield f"rowwise BR={cfg['BR']} BC={cfg['BC']}", F8._cast_rowwise, rowwise, {"BR": cfg["BR"], "BC": cfg["BC"]}
    for x in ("*bf16", "*fp32"):  # quantised along a column view: x^T / dy^T, and fp32 weights (TorchTitan)
        for cfg in F8._COLMAX.configs:
            yield (f"rowwise transposed: column amax {x} " + " ".join(f"{k}={v}" for k, v in cfg.items()),
                   F8._colmax, {"X": x, "AMAX": "*fp32", "R": "i32", "C": "i32", "stride_xr": "i32"},
                   {k: v for k, v in cfg.items() if k != "num_warps"})
        for cfg in F8._COLS_T.configs:
            yield (f"rowwise transposed cast {x} BM={cfg['BM']} BK={cfg['BK']}", F8._cast_cols_t,
                   {"X": x, "AMAX": "*fp32", "Y": "*fp8e4nv", "SINV": "*fp32", "R": "i32", "C": "i32", "YR": "i32",
                    "YC": "i32", "stride_xr": "i32", "FP8_MAX": "fp32"}, {"BM": cfg["BM"], "BK": cfg["BK"]})
    for x in ("*bf16", "*fp32"):
        tw = {"X": x, "PART": "*fp32", "Y": "*fp8e4nv", "YT": "*fp8e4nv", "SINV": "*fp32", "AMAX": "*fp32", "R": "i32",
              "C": "i32", "RP": "i32", "stride_xr": "i32", "NPART": "i32", "FP8_MAX": "fp32"}
        # record=False: a replayed forward
        for delayed, record in ((False, True), (True, True), (True, False)):
            for wy, wt in ((True, True), (True, False), (False, True)):
                for cfg in F8._TENSORWISE.configs:
                    yield (f"tensorwise {x} delayed={delayed} record={record} y={wy} t={wt} BR={cfg['BR']} "
                           f"BC={cfg['BC']}", F8._cast_tensorwise, tw,
                           {"NP": 1024, "BR": cfg["BR"], "BC": cfg["BC"], "WRITE_Y": wy, "WRITE_T": wt,
                            "DELAYED": delayed, "NS": 64, "RECORD": record})
    for most_recent in (False, True):  # after a recorded delayed cast: the history and the next scale
        yield (f"delayed advance most_recent={most_recent}", F8._delayed_advance,
               {"SC": "*fp32", "AMAX": "*fp32", "META": "*i32", "HIST": "*fp32", "L": "i32", "FP8_MAX": "fp32",
                "MARGIN_MULT": "fp32"}, {"MOST_RECENT": most_recent, "LB": 1024, "NS": 64})
    for x in ("*bf16", "*fp32"):  # the blockwise casts: every (tile, outputs) the wrapper launches, with its tiles
        cb = {"X": x, "Y": "*fp8e4nv", "YT": "*fp8e4nv", "S": "*fp32", "ST": "*fp32", "R": "i32", "C": "i32",
              "RP": "i32", "stride_xr": "i32", "stride_xc": "i32", "s_sr": "i32", "s_sc": "i32", "s_tr": "i32",
              "s_tc": "i32", "SPAD": "i32", "STPAD": "i32", "FP8_MAX": "fp32"}
        for tile in (False, True):
            for wy, wt in ((True, True), (True, False), (False, True)):
                space = F8._CAST_BLOCK.space(TILE=tile, WRITE_Y=wy, WRITE_T=wt)
                for br, bc in sorted({(c["BR"], c["BC"]) for c in space}):
                    for sat in (True, False):  # (the fp8 conversion saturates on CUDA: no clamp there)
                        yield (f"blockwise cast {x} tile={tile} y={wy} t={wt} BR={br} BC={bc} sat={sat}",
                               F8._cast_block, cb,
                               {"BR": br, "BC": bc, "TILE": tile, "WRITE_Y": wy, "WRITE_T": wt, "SAT": sat})
    for b in ("*fp8e4nv", "*fp8e5"):  # the Triton blockwise GEMM (the fallback of torch's scaled_mm)
        gb = {"A": b, "B": "*fp8e4nv", "Cp": "*bf16", "SA": "*fp32", "SB": "*fp32", "M": "i32", "N": "i32", "K": "i32",
              **{s: "i32" for s in ("s_am", "s_ak", "s_bk", "s_bn", "s_cm", "s_cn", "s_sam", "s_sak", "s_sbk",
                                    "s_sbn")}}
        for gn in (1, 128):
            for even_k in (True, False):
                for cfg in F8._GEMM_BLOCKWISE.configs:
                    yield (f"blockwise gemm A={b} SB_GN={gn} EVEN_K={even_k} BM={cfg['BM']} BN={cfg['BN']}",
                           F8._gemm_blockwise, gb,
                           {"BM": cfg["BM"], "BN": cfg["BN"], "GROUP_M": cfg["GROUP_M"], "BK": 128, "SB_GN": gn,
                            "UPCAST": b == "*fp8e5", "EVEN_K": even_k})
    # the fp8 grouped GEMM's casts (grouped_gemm_fp8.py): experts through a transposed view, per-expert token groups
    yield ("fp8 grouped: experts rows 3d", GF._cast_rows_3d,
           {"X": "*bf16", "Y": "*fp8e4nv", "S": "*fp32", "R": "i32", "C": "i32", "s_xb": "i32", "s_xr": "i32",
            "s_xc": "i32", "FP8_MAX": "fp32"}, {"BR": 64, "BC": 64})
    yield ("fp8 grouped: token groups transposed", GF._cast_groups_t,
           {"X": "*bf16", "YT": "*fp8e4nv", "S": "*fp32", "ENDS": "*i32", "PENDS": "*i32", "C": "i32", "s_xm": "i32",
            "s_xc": "i32", "s_ym": "i32", "FP8_MAX": "fp32"}, {"BM": 64, "BC": 64})
    amax = {"X": None, "PART": "*fp32", "n": "i32", "ITERS": "i32", "META": "*i32", "SC": "*fp32", "FP8_MAX": "fp32",
            "MARGIN_MULT": "fp32"}
    for x in ("*bf16", "*fp32"):
        yield (f"amax pass {x}", F8._absmax_partial, {**amax, "X": x, "META": "*fp32"}, {"BLOCK": 4096, "DELAYED": False})
        # delayed: only the first call reads X; its last program computes that call's scale
        yield f"amax pass {x} delayed", F8._absmax_partial, {**amax, "X": x}, {"BLOCK": 4096, "DELAYED": True}
    rn = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "RSTD": "*fp32", "M": "i32", "N": "i32", "stride_x": "i32",
          "stride_y": "i32", "eps": "fp32"}
    for cfg in RN._FWD.configs:
        yield f"rmsnorm fwd BLOCK_M={cfg['BLOCK_M']}", RN._rmsnorm_fwd, rn, {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": 4096}
    for dt in ("*bf16", "*fp32"):  # the fused q/k/v split + RoPE of the megatron presets (Llama-3.2-1B: r=4, d=64)
        rope = {"R": 4, "D": 64, "HALF": 32, "ROWS": RP.ROWS, "BLOCK_HALF": 32}
        yield (f"qkv_rope fwd {dt}", RP._qkv_rope_fwd,
               {"MIXED": dt, "CS": "*fp32", "Q": dt, "K": dt, "V": dt, "NROWS": "i32", "S": "i32", "B": "i32",
                "NG": "i32", "H6": "i32", "stride_ms": "i32", "stride_mb": "i32"}, rope)
        yield (f"qkv_rope bwd {dt}", RP._qkv_rope_bwd,
               {"DQ": dt, "DK": dt, "DV": dt, "CS": "*fp32", "DMIXED": dt, "NROWS": "i32", "B": "i32", "H6": "i32",
                **{f"s{t}_{a}": "i32" for t in "qkv" for a in ("b", "s", "h")}}, rope)
    # MoE permute / unpermute, the blocks `_blocks` picks: Mixtral (E8 k2 H4096), DeepSeek-V2-Lite (E64 k6 H2048),
    # E256 k8 (DeepSeek-V3)
    moe_blocks = [MO._blocks(e, h, t * k, t) for e, k, h, t in ((8, 2, 4096, 4096), (64, 6, 2048, 8192),
                                                                (256, 8, 7168, 4096))]
    for has_p in (False, True):
        for be, bk, bh in moe_blocks:
            blocks = {"BH": bh, "BE": be, "BK": bk}
            yield (f"permute has_p={has_p} BE={be} BK={bk}", MO._permute_kernel,
                   {"X": "*bf16", "MAP": "*i32", "P": "*fp32", "Y": "*bf16", "PY": "*fp32", "T": "i32", "E": "i32",
                    "H": "i32", "s_x": "i32", "s_y": "i32", "NCHUNK": "i32"}, {"HAS_P": has_p, **blocks})
            yield (f"unpermute has_p={has_p} BE={be} BK={bk}", MO._unpermute_kernel,
                   {"Y": "*bf16", "MAP": "*i32", "P": "*fp32", "OUT": "*bf16", "T": "i32", "E": "i32", "H": "i32",
                    "s_y": "i32", "s_o": "i32", "NCHUNK": "i32"}, {"HAS_P": has_p, **blocks})
    # experts' weight gradients added into main_grad (gradient_accumulation_fusion), every block shape of its space
    for dw in ("*fp32", "*bf16"):
        for bk, bn, bm in sorted({(c["BK"], c["BN"], c["BM"]) for c in GG._WGRAD_ACC.configs}):
            yield (f"grouped wgrad accumulate into {dw} BK={bk} BN={bn} BM={bm}", GG._gg_wgrad,
                   {"X": "*bf16", "DY": "*bf16", "DW": dw, "ENDS": "*i32", "K": "i32", "N": "i32",
                    **{a: "i32" for a in ("s_xm", "s_xk", "s_dm", "s_dn", "s_wg", "s_wk", "s_wn")}, "SX": dw,
                    "SD": dw}, {"BK": bk, "BN": bn, "BM": bm, "SCALED": False, "ACC": True})
    for be, bk, bh in moe_blocks:
        yield (f"unpermute bwd BE={be} BK={bk}", MO._unpermute_bwd_kernel,
               {"DO": "*bf16", "Y": "*bf16", "MAP": "*i32", "P": "*fp32", "DY": "*bf16", "DP": "*fp32", "T": "i32",
                "E": "i32", "H": "i32", "s_do": "i32", "s_y": "i32", "s_dy": "i32", "NCHUNK": "i32"},
               {"BH": bh, "BE": be, "BK": bk})
    rf = {"L": "*fp32", "P": "*fp32", "RMAP": "*i8", "A": "*fp32", "BIAS": "*fp32", "T": "i32", "E": "i32",
          "s_l": "i32", "SCALE": "fp32"}
    rb = {"L": "*fp32", "RMAP": "*i8", "GP": "*fp32", "GA": "*fp32", "DL": "*fp32", "T": "i32", "E": "i32",
          "s_l": "i32", "SCALE": "fp32"}
    for sig_fn, pre in ((False, False), (False, True), (True, False)):  # router (E=64, k=8), every tile height
        for bt in sorted({c["BT"] for c in MO._ROUTER_SPACE}):
            yield (f"router fwd sigmoid={sig_fn} pre={pre} BT={bt}", MO._router_fwd, rf,
                   {"TOPK": 8, "SIGMOID": sig_fn, "PRE_SOFTMAX": pre, "HAS_BIAS": sig_fn, "BT": bt, "BE": 64})
            yield (f"router bwd sigmoid={sig_fn} pre={pre} BT={bt}", MO._router_bwd, rb,
                   {"TOPK": 8, "SIGMOID": sig_fn, "PRE_SOFTMAX": pre, "HAS_GA": True, "BT": bt, "BE": 64})
    sw = {"H": "*bf16", "P": "*fp32", "Y": "*bf16", "N": "i32", "F": "i32", "s_h": "i32"}
    for cfg in SW._FWD.configs:  # the tuned SwiGLU forward, with and without probs
        for has_p in (False, True):
            yield (f"swiglu fwd BLOCK={cfg['BLOCK']} has_p={has_p}", SW._swiglu_fwd, sw,
                   {"HAS_P": has_p, "BLOCK": cfg["BLOCK"]})
    yield ("rope cos/sin table", RP._cos_sin_table,
           {"QF": "*fp32", "KF": "*fp32", "CS": "*fp32", "stride_qf": "i32", "stride_kf": "i32"},
           {"D": 64, "BLOCK_D": 64})


if __name__ == "__main__":
    out = {}
    for name, fn, sig, consts in checks():
        try:
            out[name] = "ok" if "tt.func" in ttir(fn, sig, consts) else "no tt.func in the module"
        except Exception as e:  # noqa: BLE001 - reported per check
            out[name] = f"{type(e).__name__}: {str(e)[-300:]}"
    print(json.dumps(out))
