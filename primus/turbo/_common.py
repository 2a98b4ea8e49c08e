"""Shared helpers for the turbo kernels: output allocation that tests can poison, device queries."""
from __future__ import annotations

import os

import torch

from primus.patches import tag_compile_caches

# Every primus custom op is defined by a module that imports this one: before any graph that calls them is compiled,
# torch.compile's caches are keyed by these sources too (a changed op is never served a stale compiled graph).
tag_compile_caches()

# Tests set POISON = True: every output buffer a kernel wrapper allocates is filled with NaN (floats) or the
# smallest integer (ints) before the kernel runs, so an element the kernel forgot to write shows up.
POISON = os.environ.get("PRIMUS_TURBO_POISON", "0") == "1"


def _poison(t: torch.Tensor) -> torch.Tensor:
    if POISON and t.numel():
        if t.dtype.is_floating_point:
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                t.view(torch.uint8).fill_(0x7F if t.dtype == torch.float8_e4m3fn else 0x7E)  # NaN bit patterns
            else:
                t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(torch.iinfo(t.dtype).min)
    return t


def empty(shape, dtype, device) -> torch.Tensor:
    return _poison(torch.empty(shape, dtype=dtype, device=device))


def empty_like(t: torch.Tensor, dtype=None) -> torch.Tensor:
    return _poison(torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device))


def num_sms(device) -> int:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_SLEEP_CYCLES_PER_MS: dict = {}
_SLEEP_RETRIES = 3  # queued_gpu_time's measurements retaken, at most, when the host outran the sleep
HOST_OUTRAN: dict = {}  # device index -> how many queued_gpu_time measurements the host outran (and were retaken)
_L2_FLUSH: dict = {}  # device index -> a buffer twice the L2's size, zeroed before each timed launch


def _l2_flush_buffer(dev: int) -> torch.Tensor:
    if dev not in _L2_FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20)
        _L2_FLUSH[dev] = torch.empty(2 * l2, dtype=torch.int8, device=f"cuda:{dev}")
    return _L2_FLUSH[dev]


def queued_gpu_time(fn, quantiles=(0.5, 0.2, 0.8), n: int = 20, reps: int = 7, flush_l2: bool = True,
                    before=None):
    """The GPU time of one `fn()` launch, in ms (the `quantiles` of `reps` measurements), for triton.autotune.

    Triton's default benchmark puts CUDA events around each launch; a launch from Python costs 35-90 us of host
    time on an H200 host, as long as these kernels run, so the events time the host and the autotuner's pick is
    noise (docs/turbo.md). Here a sleeping kernel holds the GPU while the host enqueues `n`
    launches behind it, so the events time the launches on the device: GPU time, without a CUDA-graph capture (a
    failed capture can poison the process).

    flush_l2: each launch runs after a write of twice the L2 and is timed alone (events around it, still queued
    behind the sleep), so it reads its inputs from HBM, as a cast or norm does in training: there its input was
    written long before, or is larger than the L2. Launched back to back (flush_l2=False, the earlier
    form) a 34-67 MB input is read partly from the 50 MB L2. On the H200 the two forms picked the same config in 45 of
    48 autotunes, the cold picks closer to the fastest config by profiler time (44 within 1%, against 42;
    2026-12-03).

    before: with flush_l2, launched after each flush and before the timed launch, untimed: the pass that precedes
    this kernel in use, so the launch finds the L2 as it does there (a cast's second pass reads x just after the
    first pass read it)."""
    import time

    import torch

    dev = torch.cuda.current_device()
    fn()  # compiles on first use
    torch.cuda.synchronize()
    if dev not in _SLEEP_CYCLES_PER_MS:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(1 << 22)
        b.record()
        torch.cuda.synchronize()
        _SLEEP_CYCLES_PER_MS[dev] = (1 << 22) / max(a.elapsed_time(b), 1e-3)
    flush = _l2_flush_buffer(dev) if flush_l2 else None
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n if flush_l2 else 1)]
    slept = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def launches():
        if flush is None:
            events[0][0].record()
            for _ in range(n):
                fn()
            events[0][1].record()
            return
        for a, b in events:
            flush.zero_()
            if before is not None:
                before()
            a.record()
            fn()
            b.record()

    t = time.perf_counter()
    launches()
    host_ms = time.perf_counter() - t
    torch.cuda.synchronize()
    host_ms *= 1e3
    times = []
    for _ in range(reps):
        for attempt in range(_SLEEP_RETRIES + 1):
            # The sleep must outlast the host's enqueueing, or the GPU waits for launches and the events time the
            # host. Two things made it fall short: the host stalling after the pass that sized it (a garbage
            # collection, a profiler's teardown), and the sleep's clock: calibrated on an idle GPU, a cycle count
            # ran 5x faster once the clocks had risen (H200, 2026-12-03). So each sleep is timed too and the
            # calibration keeps the fastest clock seen; a measurement the host outran is taken again, its sleep
            # sized from the slower host time.
            cycles = int(_SLEEP_CYCLES_PER_MS[dev] * (2 * host_ms + 0.2))
            slept[0].record()
            torch.cuda._sleep(cycles)
            slept[1].record()
            t = time.perf_counter()
            launches()
            outran = slept[1].query()  # True: the sleep ended before the host had enqueued every launch
            took_ms = (time.perf_counter() - t) * 1e3
            torch.cuda.synchronize()
            rate = cycles / max(slept[0].elapsed_time(slept[1]), 1e-3)
            _SLEEP_CYCLES_PER_MS[dev] = max(_SLEEP_CYCLES_PER_MS[dev], rate)
            if not outran:
                break
            HOST_OUTRAN[dev] = HOST_OUTRAN.get(dev, 0) + 1
            host_ms = max(host_ms, took_ms)
        times.append(sum(a.elapsed_time(b) for a, b in events) / n)
    times.sort()
    pick = [times[min(len(times) - 1, int(q * len(times)))] for q in (quantiles or (0.5,))]
    return pick if quantiles else pick[0]


_LAUNCH = ("num_warps", "num_stages")  # a config's launch options (the rest are the kernel's constexprs)


class Tuned:
    """A Triton kernel with a small space of launch configs (constexpr block sizes + num_warps).

    On a GPU, the first `launch` for a value of `key` (plus the call's constexprs and the tensors' dtypes) goes
    through triton.autotune over the configs `valid` keeps: each is timed on the device (queued_gpu_time, not the
    host launch path) and the fastest is remembered
    here; later calls launch that config directly. (triton.autotune's per-call Python - its key, dicts of every
    argument - sits on the host path of each launch, which for a 70 us norm or cast is not small; and its cache
    key ignores constexprs that are not in `key`, so a softmax router's pick served the sigmoid one.) The
    hand-picked config goes first in each space, so the pick is never one slower than it (benchmark noise aside).
    Triton's interpreter has no driver to benchmark with: there `launch` runs the caller's default. `run(cfg, ...)`
    launches one given config; the CPU tests run every config of a space through it (and tests/frontend_compile.py
    compiles each for sm90).
        grid(meta) -> launch grid from the config's constexprs (meta["BLOCK_M"]...); the caller closes over sizes
        valid(cfg, **the call's scalar args and constexprs) -> bool
        before(args, consts) -> None: the pass that runs just before this kernel in use, launched untimed before
            each timed launch (queued_gpu_time's `before`)
    """

    spaces: list = []  # every Tuned built in this process (autotune_picks reads their picks)

    def __init__(self, kernel, configs, key, valid=None, before=None):
        import triton

        Tuned.spaces.append(self)
        self.kernel, self.configs = kernel, [dict(c) for c in configs]
        self.valid = valid or (lambda cfg, **kw: True)
        self.key = list(key)
        self.picked = {}  # call key -> the config autotune chose for it
        self.before = before
        self._before_now = None  # `before` bound to the call being tuned
        # num_stages only where a space names it (the backend's default stays otherwise: 3 on CUDA, 2 on ROCm)
        self._stages = any("num_stages" in c for c in self.configs)
        self._auto = triton.autotune([triton.Config({k: v for k, v in c.items() if k not in _LAUNCH},
                                                    num_warps=c.get("num_warps", 4),
                                                    **({"num_stages": c.get("num_stages", 3)} if self._stages
                                                       else {})) for c in self.configs],
                                     key=list(key), prune_configs_by={"early_config_prune": self.prune},
                                     do_bench=self.bench)(kernel)

    def bench(self, fn, **kw):
        """triton.autotune's do_bench: queued_gpu_time, after `before` for the call being tuned."""
        return queued_gpu_time(fn, before=self._before_now, **kw)

    @staticmethod
    def _scalars(named) -> dict:
        return {k: v for k, v in named.items() if isinstance(v, (int, float, bool))}

    def prune(self, configs, named_args, **kwargs):
        """triton.autotune's early_config_prune: the triton.Configs `valid` admits for this call's scalars."""
        scalars = self._scalars({**named_args, **kwargs})
        keep = [c for c in configs if self.valid({**c.kwargs, "num_warps": c.num_warps}, **scalars)]
        return keep or list(configs[:1])

    def space(self, args=(), **consts):
        """The configs `valid` admits for a call with these positional args and constexprs."""
        scalars = self._scalars({**dict(zip(self.kernel.arg_names, args)), **consts})
        return [c for c in self.configs if self.valid(c, **scalars)] or self.configs[:1]

    def run(self, cfg, grid, args, **consts):
        meta = {k: v for k, v in cfg.items() if k not in _LAUNCH}
        launch = {k: cfg[k] for k in _LAUNCH if k in cfg}
        launch.setdefault("num_warps", 4)
        self.kernel[grid({**consts, **meta})](*args, **consts, **meta, **launch)

    def call_key(self, args, consts) -> tuple:
        named = dict(zip(self.kernel.arg_names, args))
        return (tuple(named[k] for k in self.key if k in named), tuple(sorted(consts.items())),
                tuple(str(a.dtype) for a in args if hasattr(a, "dtype")))

    def launch(self, grid, args, default=None, stateful=(), **consts):
        """default: the config the interpreter runs (else the space's first). stateful: indices of args whose
        contents the launch changes in a way a second run would change again (the delayed cast's state): the
        autotune, which re-runs the kernel per config, runs on copies of them, then the pick once on the real."""
        if interpreting():
            return self.run(default or self.space(args, **consts)[0], grid, args, **consts)
        key = self.call_key(args, consts)
        cfg = self.picked.get(key)
        if cfg is not None:
            return self.run(cfg, grid, args, **consts)
        space = self.space(args, **consts)
        if len(space) == 1:
            cfg = space[0]
            self.run(cfg, grid, args, **consts)
        else:
            tune_args = tuple(a.clone() if i in stateful else a for i, a in enumerate(args))
            self._auto.cache.clear()  # its key lacks our constexprs: benchmark this call's space afresh
            if self.before is not None:
                self._before_now = lambda: self.before(args, consts)
            try:
                self._auto[lambda meta: grid(dict(meta))](*tune_args, **consts)
            finally:
                self._before_now = None
            best = self._auto.best_config
            cfg = {**best.kwargs, "num_warps": best.num_warps}
            if self._stages:
                cfg["num_stages"] = best.num_stages
            if stateful:
                self.run(cfg, grid, args, **consts)
        self.picked[key] = cfg


def autotune_picks() -> list:
    """The launch config each tuned kernel picked in this process, one entry per call key (result.json's
    `turbo_autotune`): two runs that differ in speed can be compared kernel by kernel, since an autotuned pick can
    vary between processes (docs/turbo.md). Empty without a GPU (the interpreter does not tune)."""
    out = []
    for t in Tuned.spaces:
        for (key, consts, dtypes), cfg in t.picked.items():
            out.append({"kernel": f"{t.kernel.fn.__module__}.{t.kernel.__name__}", "key": dict(zip(t.key, key)),
                        "constexprs": dict(consts), "dtypes": list(dtypes), "config": dict(cfg),
                        "configs_in_space": len(t.configs)})
    return out


if interpreting():
    from primus.patches import fix_triton_interpreter

    fix_triton_interpreter()  # Triton 3.6's interpreter defects (primus/patches/triton_interpreter.py)
