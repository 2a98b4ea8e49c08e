"""Dense peak TFLOP/s per GPU (vendor datasheets, no sparsity), detected from torch's device name.

MFU is reported against the bf16 peak (also for fp8 runs: "bf16-peak-equivalent"), as the reference does; the fp8
peak is recorded beside it.
"""
from typing import Optional, Tuple

# name fragment -> (bf16 dense TFLOP/s, fp8 dense TFLOP/s). Order matters: more specific first.
PEAKS = [
    ("H100 PCIe", (756.0, 1513.0)),
    ("H100", (989.4, 1978.9)),
    ("H200", (989.4, 1978.9)),
    ("MI355X", (2516.6, 5033.2)),
    ("MI325X", (1307.4, 2614.9)),
    ("MI300X", (1307.4, 2614.9)),
]


def peak_tflops(gpu_name: Optional[str]) -> Optional[Tuple[float, float]]:
    """(bf16, fp8) dense peaks for a device name, or None (CPU or an unknown GPU: MFU is then null)."""
    if not gpu_name:
        return None
    for frag, peaks in PEAKS:
        if frag.lower() in gpu_name.lower():
            return peaks
    return None
