"""Does the tensorwise cast write every element of both outputs on this GPU? Outputs poisoned (NaN bytes) before
each run; fp32 and bf16 input, both outputs and the transpose alone. Session 3 on the H200 (Triton 3.6): with
both outputs from one kernel, fp32 input left up to 6% of the transpose unwritten (260 of 3072 for 48x64); the
cast now splits fp32 input into one launch per output (primus/turbo/fp8_linear.py, cast_tensorwise).

    python bench/fp8_cast_probe.py
"""
import torch

from primus.turbo import _common
from primus.turbo import fp8_linear as F8

_common.POISON = True


def nan_report(t, name):
    bad = torch.isnan(t.float())
    n = int(bad.sum())
    return f"{name}: ok" if not n else f"{name}: {n} unwritten of {t.numel()}, first at {bad.nonzero()[:4].tolist()}"


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for R, C in ((48, 64), (512, 256), (8192, 2048)):
        for dt in (torch.float32, torch.bfloat16):
            x = torch.randn(R, C, device=dev, dtype=dt)
            y, yt, _ = F8.cast_tensorwise(x, torch.float8_e4m3fn, want_y=True, want_t=True, pad_t=False)
            _, yt2, _ = F8.cast_tensorwise(x, torch.float8_e4m3fn, want_y=False, want_t=True, pad_t=False)
            print(f"R={R} C={C} {dt}: {nan_report(y, 'y')}; {nan_report(yt, 'yT (both)')}; "
                  f"{nan_report(yt2, 'yT (alone)')}", flush=True)


if __name__ == "__main__":
    main()
