"""Which step of the fp8 linear goes wrong with fp32 weights (TorchTitan's one-GPU case) on this GPU? Each piece
vs float64, printed as relative error and finiteness (session 3: the poisoned fp32-weight tests failed on the H200).

    python bench/fp8_fp32_weight_probe.py
"""
import torch

from primus.turbo import fp8_linear as F8


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    fin = bool(torch.isfinite(a).all())
    return f"finite={fin} relerr={((a - b).norm() / b.norm()).item():.3e}" if fin else f"finite=False " \
        f"(nan {int(torch.isnan(a).sum())}, inf {int(torch.isinf(a).sum())} of {a.numel()})"


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    f8, e5 = F8.fp8_dtypes(dev)
    for M, K, N in ((1024, 256, 512), (50, 64, 48)):
        torch.manual_seed(0)
        for wdt in (torch.float32, torch.bfloat16):
            w = torch.randn(N, K, device=dev, dtype=wdt) / K ** 0.5
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
            wq, wqt, sw = F8.cast_tensorwise(w, f8, want_y=True, want_t=True, pad_t=False)
            print(f"M={M} K={K} N={N} weight {wdt}: cast w {rel(wq.double() * sw.double(), w)}; "
                  f"w^T {rel(wqt.t().double() * sw.double(), w)}")
            y, st = F8.fp8_forward(x, w, None, "tensorwise", "hybrid")
            print("  forward y", rel(y, x.double() @ w.double().t()))
            dx, dw, _ = F8.fp8_backward(st, dy, need_db=False)
            print("  dgrad", rel(dx, dy.double() @ w.double()), "| wgrad", dw.dtype, rel(dw, dy.double().t() @ x.double()))
            dyq, dyqt, sdy = F8.cast_tensorwise(dy, e5, want_y=True, want_t=True)
            xqt, sx = st.tensors[0], st.tensors[1]
            for out in (torch.float32, torch.bfloat16):
                for fast in (False, True):
                    try:
                        r = torch._scaled_mm(dyqt, xqt.t(), scale_a=sdy, scale_b=sx, out_dtype=out, use_fast_accum=fast)
                        print(f"  _scaled_mm wgrad out={out} fast={fast}:", rel(r, dy.double().t() @ x.double()))
                    except Exception as e:  # noqa: BLE001
                        print(f"  _scaled_mm wgrad out={out} fast={fast}: {type(e).__name__}: {str(e)[:160]}")


if __name__ == "__main__":
    main()
