"""Which BLASLt library (cuBLASLt or hipBLASLt) to bind, its per-library constants, and where to find it.

The two libraries share one C call sequence under different prefixes and enum values, so the binding layer
(`lt_bindings`) is written once against a `LibrarySpec` from the table below.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


class LtLibraryNotFound(RuntimeError):
    """No cuBLASLt / hipBLASLt shared library could be loaded; the message lists everything that was tried."""


@dataclass(frozen=True)
class LibrarySpec:
    name: str                    # human name: cuBLASLt / hipBLASLt
    prefix: str                  # C symbol prefix
    maps_pattern: str            # file-name stem to look for in /proc/self/maps
    sonames: tuple[str, ...]     # names for the dynamic loader, newest first
    wheel_globs: tuple[str, ...]  # relative to site-packages (torch's own copy)
    system_dirs: tuple[str, ...]
    # enum values
    op: dict                     # "N"/"T" -> operation
    compute_32f: int
    dtypes: dict                 # type name ("bf16_r") -> data type code
    desc_attr: dict              # matmul descriptor attributes
    layout_attr: dict            # matrix layout attributes
    pref_attr: dict              # preference attributes
    epilogue: dict
    algo_size: int               # sizeof(<lib>MatmulAlgo_t)
    heuristic_size: int          # sizeof(<lib>MatmulHeuristicResult_t)
    # cuBLASLt only: the configuration attributes (name, enum, ctype) that rebuild an algorithm, the capability
    # attributes used to enumerate candidates. hipBLASLt's equivalents are C++ only.
    algo_config: tuple = ()
    algo_caps: dict = field(default_factory=dict)
    # GemmProblem.scaleA / scaleB code -> the library's scale-mode enum (set as A/B_SCALE_MODE); codes not here
    # are not bound for this library
    scale_modes: dict = field(default_factory=dict)


CUBLASLT = LibrarySpec(
    name="cuBLASLt", prefix="cublasLt", maps_pattern="libcublasLt.so",
    sonames=("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"),
    wheel_globs=("nvidia/cu13/lib/libcublasLt.so*", "nvidia/cublas/lib/libcublasLt.so*"),
    system_dirs=("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"),
    op={"N": 0, "T": 1}, compute_32f=68,
    dtypes={"f32_r": 0, "f16_r": 2, "bf16_r": 14, "f8_r": 28, "bf8_r": 29},
    desc_attr={"COMPUTE_TYPE": 0, "SCALE_TYPE": 1, "POINTER_MODE": 2, "TRANSA": 3, "TRANSB": 4, "EPILOGUE": 7,
               "BIAS_POINTER": 8, "A_SCALE_POINTER": 17, "B_SCALE_POINTER": 18, "D_SCALE_POINTER": 20,
               "AMAX_D_POINTER": 21, "FAST_ACCUM": 25, "BIAS_DATA_TYPE": 26, "A_SCALE_MODE": 31,
               "B_SCALE_MODE": 32},
    layout_attr={"TYPE": 0, "ORDER": 1, "ROWS": 2, "COLS": 3, "LD": 4, "BATCH_COUNT": 5,
                 "STRIDED_BATCH_OFFSET": 6},
    pref_attr={"SEARCH_MODE": 0, "MAX_WORKSPACE_BYTES": 1, "MIN_ALIGNMENT_A_BYTES": 5,
               "MIN_ALIGNMENT_B_BYTES": 6, "MIN_ALIGNMENT_C_BYTES": 7, "MIN_ALIGNMENT_D_BYTES": 8},
    epilogue={"DEFAULT": 1, "BIAS": 4},
    algo_size=64, heuristic_size=96,
    algo_config=(("algo_id", 0, ctypes.c_int32), ("tile_id", 1, ctypes.c_uint32),
                 ("splitk_num", 2, ctypes.c_int32), ("reduction_scheme", 3, ctypes.c_uint32),
                 ("cta_swizzling", 4, ctypes.c_uint32), ("custom_option", 5, ctypes.c_uint32),
                 ("stages_id", 6, ctypes.c_uint32), ("inner_shape_id", 7, ctypes.c_uint16),
                 ("cluster_shape_id", 8, ctypes.c_uint16)),
    algo_caps={"SPLITK_SUPPORT": 0, "REDUCTION_SCHEME_MASK": 1, "CTA_SWIZZLING_SUPPORT": 2, "TILE_IDS": 6,
               "CUSTOM_OPTION_MAX": 7, "STAGES_IDS": 13, "MIN_ALIGNMENT_A_BYTES": 16,
               "MIN_ALIGNMENT_B_BYTES": 17, "MIN_ALIGNMENT_C_BYTES": 18, "MIN_ALIGNMENT_D_BYTES": 19},
    # cublasLtMatmulMatrixScale_t: SCALAR_32F 0, OUTER_VEC_32F 3, VEC128_32F 4, BLK128x128_32F 5 (CUDA >= 12.9)
    scale_modes={1: 0, 2: 3, 3: 4, 4: 5},
)

HIPBLASLT = LibrarySpec(
    name="hipBLASLt", prefix="hipblasLt", maps_pattern="libhipblaslt.so",
    sonames=("libhipblaslt.so.1", "libhipblaslt.so.0", "libhipblaslt.so"),
    wheel_globs=("torch/lib/libhipblaslt.so*", "_rocm_sdk_libraries*/lib/libhipblaslt.so*"),
    system_dirs=("/opt/rocm/lib", "/opt/rocm/lib64"),
    op={"N": 111, "T": 112}, compute_32f=2,
    dtypes={"f32_r": 0, "f16_r": 2, "bf16_r": 14, "f8_r": 28, "bf8_r": 29, "f8_fnuz_r": 1000, "bf8_fnuz_r": 1001},
    desc_attr={"TRANSA": 0, "TRANSB": 1, "EPILOGUE": 2, "BIAS_POINTER": 3, "BIAS_DATA_TYPE": 4,
               "A_SCALE_POINTER": 5, "B_SCALE_POINTER": 6, "D_SCALE_POINTER": 8, "POINTER_MODE": 13,
               "AMAX_D_POINTER": 14},
    layout_attr={"BATCH_COUNT": 0, "STRIDED_BATCH_OFFSET": 1, "TYPE": 2, "ORDER": 3, "ROWS": 4, "COLS": 5, "LD": 6},
    pref_attr={"SEARCH_MODE": 0, "MAX_WORKSPACE_BYTES": 1},
    epilogue={"DEFAULT": 1, "BIAS": 4},
    algo_size=24, heuristic_size=56,
)

SPECS = {"cublaslt": CUBLASLT, "hipblaslt": HIPBLASLT}


def runtime_spec() -> LibrarySpec | None:
    """The library of the torch build in this process (None for a CPU-only build)."""
    try:
        import torch
    except ImportError:
        return None
    if getattr(torch.version, "hip", None):
        return HIPBLASLT
    if getattr(torch.version, "cuda", None):
        return CUBLASLT
    return None


def _read_maps() -> str:
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


def mapped_paths(spec: LibrarySpec, maps_text: str | None = None) -> list[str]:
    """Paths of the library already mapped into this process (the copy torch loaded)."""
    text = _read_maps() if maps_text is None else maps_text
    seen: list[str] = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and spec.maps_pattern in os.path.basename(parts[5]) and parts[5] not in seen:
            seen.append(parts[5])
    return seen


def candidate_paths(spec: LibrarySpec, maps_text: str | None = None) -> list[str]:
    """Where to look, in order: already loaded, torch's wheel folder, the loader's names, system folders."""
    paths = mapped_paths(spec, maps_text)
    for site in _site_dirs():
        for pattern in spec.wheel_globs:
            paths += sorted(glob.glob(os.path.join(site, pattern)), reverse=True)
    found = ctypes.util.find_library(spec.prefix) or ctypes.util.find_library(spec.maps_pattern[3:-3])
    if found:
        paths.append(found)
    paths += list(spec.sonames)
    for d in spec.system_dirs:
        paths += [os.path.join(d, s) for s in spec.sonames]
    return list(dict.fromkeys(paths))


def _site_dirs() -> list[str]:
    dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    try:
        import torch
        dirs.insert(0, str(Path(torch.__file__).parent.parent))
    except ImportError:
        pass
    return list(dict.fromkeys(dirs))


def _warm_up_torch_blas() -> None:
    """Run one tiny matmul so the runtime maps its BLASLt library (torch loads it lazily)."""
    try:
        import torch
        if torch.cuda.is_available():
            a = torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
            torch.nn.functional.linear(a, a, a[0])  # linear with a bias goes through the Lt library
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - only a hint for the /proc/self/maps scan
        pass


def load_library(library: str | None = None, *, maps_text: str | None = None) -> tuple[LibrarySpec, ctypes.CDLL, str]:
    """Load cuBLASLt or hipBLASLt, preferring the copy torch already loaded.

    `library` is "cublaslt" / "hipblaslt" / None (the torch build's; on a CPU build both are tried).
    Raises LtLibraryNotFound naming every path tried.
    """
    if library is not None:
        try:
            specs = [SPECS[library.lower()]]
        except KeyError:
            raise ValueError(f"unknown library {library!r}; expected one of {sorted(SPECS)}") from None
    else:
        own = runtime_spec()
        specs = [own] if own else [CUBLASLT, HIPBLASLT]
    if maps_text is None and any(not mapped_paths(s) for s in specs):
        _warm_up_torch_blas()
    tried: list[str] = []
    for spec in specs:
        if not mapped_paths(spec, maps_text):
            tried.append(f"/proc/self/maps (no {spec.maps_pattern} loaded in this process)")
        for site in _site_dirs():
            for pattern in spec.wheel_globs:
                if not glob.glob(os.path.join(site, pattern)):
                    tried.append(f"{os.path.join(site, pattern)} (no match)")
        for path in candidate_paths(spec, maps_text):
            if os.path.isabs(path) and not os.path.exists(path):
                tried.append(f"{path} (absent)")
                continue
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{path} ({str(e).split(':')[-1].strip() or 'cannot load'})")
                continue
            if not hasattr(lib, spec.prefix + "Matmul"):
                tried.append(f"{path} (no {spec.prefix}Matmul symbol)")
                continue
            return spec, lib, path
    names = " or ".join(s.name for s in specs)
    raise LtLibraryNotFound(
        f"{names} shared library not found (is this a GPU build of torch on a GPU machine?). Tried:\n  "
        + "\n  ".join(tried))
