"""Shared test helpers: compose configs offline with Hydra's compose API, exactly as train.py would; the guard that
keeps unit tests unit tests; the local Slurm cluster.

Markers (pyproject.toml lists them): a test with none is a unit test: in-process, no subprocess, no trainer, no
process group. The guard below fails such a test the moment it starts a process, builds a trainer or initialises
torch.distributed, so `make test-fast` (`-m "not e2e and not slow and not slurm"`) runs no trainer. A test that
needs one is marked `e2e` (seconds) or `slow` (a minute or more); `slurm` ones need the local cluster.
"""
import contextlib
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

# The cores shared out among pytest-xdist workers: torch's intra-op pool (and inductor's C++ kernels, OpenMP) default
# to every core in every worker, and each subprocess that inherits the env likewise, so two workers on two cores ran
# four or more busy threads. Only where the caller has not chosen; set before torch is imported. In one process
# (-n 0) nothing changes: the local launcher shares the cores out among its ranks itself.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

# Without a GPU, Triton kernels run in Triton's interpreter. It must be chosen before triton is first imported
# (torch and torchtitan import it early), so it is set here, for the whole session and its subprocesses.
if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "conf")
PY = sys.executable

from primus.config.hydra_compat import quote_numeric_group_choices  # noqa: E402
from primus.config.schema import register  # noqa: E402

register()


_COMPOSED = {}


def compose_dict(overrides=()):
    """The composed DictConfig for these overrides. Hydra composes each distinct override list once per process
    (about a second of CPU each, and the unit tests ask for the same few hundred lists over and over); every caller
    gets its own deep copy. Interpolations stay unresolved in the copy, as in a fresh compose. A compose error is
    raised again on every call (nothing is stored for it)."""
    key = tuple(quote_numeric_group_choices(list(overrides)))
    if key not in _COMPOSED:
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            _COMPOSED[key] = compose("config", overrides=list(key))
    return copy.deepcopy(_COMPOSED[key])


def compose_cfg(overrides=()):
    """The typed PrimusConfig for these overrides."""
    return OmegaConf.to_object(compose_dict(overrides))


def turbo_kernels_smoke(only: str):
    """`bench/turbo_kernels.py --smoke --only <only>` (the CPU smoke size): its rows for that kernel. Fails on a
    non-zero exit or a FAILED row."""
    import subprocess

    r = subprocess.run([PY, "bench/turbo_kernels.py", "--smoke", "--no-tests", "--only", only], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "FAILED" not in r.stdout, r.stdout[-2000:]
    return [line for line in r.stdout.splitlines() if line.startswith(f"| {only} |")]


def modelled_gap_s(slow, fast, gpu, world=1):
    """How many seconds a step the planner's step model (primus.plan.advice.step_cost_s, on each config's own memory
    estimate) puts config `fast` ahead of config `slow`."""
    from primus.plan.advice import step_cost_s
    from primus.plan.memory import estimate_memory

    return (step_cost_s(slow, estimate_memory(slow, gpu, world), gpu, world)
            - step_cost_s(fast, estimate_memory(fast, gpu, world), gpu, world))


def run_path_to_setup(monkeypatch, tmp_path, probe, overrides=()):
    """Drive the real run path (primus.train_loop.train, device=cpu) with a stand-in trainer whose setup returns
    probe() and stops the run there; returns what probe saw when the backend started building."""
    import primus.backends
    from primus.backends.base import Trainer
    from primus.context import resolve
    from primus.train_loop import train

    seen = {}

    class Stop(Exception):
        pass

    class Recorder(Trainer):
        name = "recorder"

        def setup(self):
            seen["probe"] = probe()
            raise Stop

        def train_step(self, step):
            raise AssertionError("not reached")

    monkeypatch.setattr(primus.backends, "trainer_class", lambda cfg: Recorder)
    monkeypatch.setattr("primus.train_loop.git_sha", lambda: None)  # no `git` process in a unit test
    cfg = compose_cfg(["device=cpu", "training.train_iters=1", "logging.tensorboard=false", *overrides])
    with pytest.raises(Stop):
        train(cfg, resolve(cfg, str(tmp_path)), {})
    return seen["probe"]


# ------------------------------------------------------------------------------------------------ unit-test guard

END_TO_END = ("e2e", "slow", "slurm", "scale")
# Compilers that torch.compile / Triton run as processes (inductor's C++ build, its compile-worker pool) are part of
# an in-process op test, not an end-to-end run: a process started from these packages passes.
TOOLCHAIN = (os.sep + os.path.join("torch", "_inductor") + os.sep, os.sep + os.path.join("torch", "utils") + os.sep,
             os.sep + "triton" + os.sep)


class NotAUnitTest(Exception):
    pass


def _from_toolchain() -> bool:
    return any(any(t in f.filename for t in TOOLCHAIN) for f in traceback.extract_stack()[:-2])


@contextlib.contextmanager
def _unit_guard():
    """Within: starting a process, building a backend trainer or a process group raises NotAUnitTest, and is
    recorded, so that code which catches the error (a fallback) still fails the test."""
    import multiprocessing.process

    import torch.distributed as dist

    from primus.backends import base

    seen = []

    def guarded(orig, what):
        def refuse(*a, **k):
            if what == "a process" and _from_toolchain():
                return orig(*a, **k)
            msg = (f"{what} in a test without a marker: a unit test starts no process, builds no trainer and "
                   f"initialises no process group. Mark it @pytest.mark.e2e (seconds) or @pytest.mark.slow (a minute "
                   f"or more), or make it a unit test (pyproject.toml lists the markers).")
            seen.append(msg)
            raise NotAUnitTest(msg)
        return refuse

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(subprocess.Popen, "__init__", guarded(subprocess.Popen.__init__, "a process"))
        for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                mp.setattr(os, name, guarded(getattr(os, name), "a process"))
        mp.setattr(multiprocessing.process.BaseProcess, "start",
                   guarded(multiprocessing.process.BaseProcess.start, "a process"))
        mp.setattr(base.Trainer, "__init__", guarded(None, "a backend trainer"))
        if dist.is_available():
            mp.setattr(dist, "init_process_group", guarded(None, "torch.distributed.init_process_group"))
            mp.setattr(dist.distributed_c10d, "init_process_group",
                       guarded(None, "torch.distributed.init_process_group"))
        yield seen
    finally:
        mp.undo()


@contextlib.contextmanager
def _guarded(item):
    if any(item.get_closest_marker(m) for m in END_TO_END):
        yield
        return
    with _unit_guard() as seen:
        yield
    if seen:
        raise NotAUnitTest(seen[0])


# Seconds each longer test took in a full run (all phases), for the order below; `--record-durations` rewrites it.
DURATIONS = os.path.join(ROOT, "tests", "data", "test_durations.json")
DURATION_FLOOR = 2.0  # shorter tests are not listed: their marker's default below orders them well enough
DEFAULT_SECONDS = {"slow": 60.0, "slurm": 60.0, "scale": 60.0, "e2e": 10.0}


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help=f"after the run, write each test's duration (>= {DURATION_FLOOR:g}s) to {DURATIONS} "
                          "(the order pytest-xdist hands tests out in)")


def pytest_configure(config):
    # pytest-xdist's loadgroup would queue the xdist_groups with the most tests first, whatever they cost: keep the
    # order pytest_collection_modifyitems gives (by expected seconds, groups included)
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def _read_durations() -> dict:
    try:
        with open(DURATIONS) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _plain_id(nodeid: str) -> str:
    """The test's id without the `@<group>` suffix given below."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def _expected_seconds(item, table) -> float:
    known = table.get(_plain_id(item.nodeid))
    if known is not None:
        return known
    return max((s for m, s in DEFAULT_SECONDS.items() if item.get_closest_marker(m)), default=0.0)


def _group_of(item) -> str:
    return "_".join(sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in item.iter_markers("xdist_group")}))


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, hand out the longest work first: a minutes-long run started last would finish the session
    alone on one worker. Work is a test, or a whole xdist_group (one worker runs it), ordered by its expected
    seconds: the recorded ones (DURATIONS), else its marker's default (slow before e2e before unit tests).
    With --dist loadgroup, name each test of an xdist_group `<id>@<group>`, the id the scheduler keeps together:
    pytest-xdist 3.8 sets the old `_nodeid` attribute, which pytest 9.2 no longer reads (its node ids are
    structured), so without this the groups split."""
    if not hasattr(config, "workerinput"):
        return
    table = _read_durations()
    unit = {it.nodeid: _group_of(it) or it.nodeid for it in items}
    total, first = {}, {}
    for i, it in enumerate(items):
        total[unit[it.nodeid]] = total.get(unit[it.nodeid], 0.0) + _expected_seconds(it, table)
        first.setdefault(unit[it.nodeid], i)
    order = {it.nodeid: i for i, it in enumerate(items)}
    items.sort(key=lambda it: (-total[unit[it.nodeid]], first[unit[it.nodeid]], order[it.nodeid]))
    if not config.getvalue("loadgroup"):
        return
    for item in items:
        group = _group_of(item)
        if group and item.nodeid.rfind("@") <= item.nodeid.rfind("]"):  # not named yet
            named = f"{item.nodeid}@{group}"
            try:
                from _pytest.nodeid import NodeId
            except ImportError:  # an older pytest reads _nodeid (and pytest-xdist has set it)
                item._nodeid = named
            else:
                item._id = NodeId.parse(named)


_durations = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown"):
        key = _plain_id(report.nodeid)
        _durations[key] = _durations.get(key, 0.0) + report.duration


def pytest_sessionfinish(session):
    """--record-durations: the tests of this run replace their entries (the ones now under the floor leave)."""
    if not session.config.getoption("record_durations") or hasattr(session.config, "workerinput"):
        return
    table = _read_durations()
    for key, seconds in _durations.items():
        table.pop(key, None)
        if seconds >= DURATION_FLOOR:
            table[key] = round(seconds, 1)
    with open(DURATIONS, "w") as f:
        json.dump(dict(sorted(table.items())), f, indent=0)
        f.write("\n")


# every phase: a module- or session-scoped fixture is set up inside the first test that needs it
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    # the last test of a session also tears the session's fixtures down (the Slurm cluster's `stop`), whatever it is
    with _guarded(item) if nextitem is not None else contextlib.nullcontext():
        return (yield)


# ------------------------------------------------------------------------------------------------ fixtures

@pytest.fixture
def cfg_of():
    return compose_cfg


@pytest.fixture
def weight_casts():
    """primus.turbo.fp8_linear.WEIGHT_CASTS on, counters at 0, off again after the test (imported here, after the
    test module's turbo_util has chosen Triton's interpreter on CPU)."""
    from primus.turbo.fp8_linear import WEIGHT_CASTS

    WEIGHT_CASTS.enable(True)
    WEIGHT_CASTS.hits = WEIGHT_CASTS.misses = 0
    yield WEIGHT_CASTS
    WEIGHT_CASTS.enable(False)


@pytest.fixture(autouse=True)
def _restore_environ():
    """Tests that drive trainers in-process set RANK/WORLD_SIZE/MASTER_PORT... and process-wide switches: never
    let them leak into later tests (a leaked MASTER_PORT sends the next train.py subprocess to a port this process still listens on)."""
    saved = dict(os.environ)
    dynamo = sys.modules.get("torch._dynamo")
    dynamo_disabled = dynamo.config.disable if dynamo else None
    yield
    os.environ.clear()
    os.environ.update(saved)
    # megatron's CPU redirections switch torch.compile off for their process (patches/cpu.py, item 7): a test that
    # drives megatron in-process must not leave later compile tests running with dynamo disabled
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.config.disable = bool(dynamo_disabled)


# ------------------------------------------------------------------------------------------------ local Slurm cluster

def _below_ephemeral_range() -> range:
    """Ports the kernel never hands to an outgoing connection or a bind to port 0: a port probed free here stays free
    until the daemon binds it, whatever the tests running beside this one open meanwhile."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default range starts here
    return range(10000, max(10001, low))


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _free_ports(nodes: int):
    """A free port for slurmctld, and the first of `nodes` consecutive free ports for the slurmd daemons, all outside
    the ephemeral range (a probed ephemeral port can be taken by another socket before slurmctld binds it)."""
    import random

    span = _below_ephemeral_range()
    while True:
        ctld, first = random.sample(span[:-nodes], 2)
        block = range(first, first + nodes)
        if ctld not in block and _bindable(ctld) and all(_bindable(p) for p in block):
            return ctld, first


@pytest.fixture(scope="session")
def cluster():
    """A one-node Slurm cluster on this machine (launchers/slurm_cluster.sh), started once per test session (once per
    pytest-xdist worker: `make test` runs the slurm tests on one, their xdist_group), stopped at its end. Its state,
    config and logs live in a temp dir, on free ports, so a cluster someone else runs here is left alone.
    Yields the env clients need: SLURM_CONF and PATH with the sacct stand-in first."""
    yield from _local_cluster(1)


@pytest.fixture(scope="session")
def cluster2():
    """Two Slurm nodes on this machine (node1, node2: one slurmd each, SLURM_NODES=2), like `cluster` otherwise."""
    yield from _local_cluster(2)


def _local_cluster(nodes: int):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("no slurm-wlm and no apt-get to install it")
    script = os.path.join(ROOT, "launchers", "slurm_cluster.sh")
    d = tempfile.mkdtemp(prefix="primus-slurm-")  # short path: slurmd puts unix sockets in its spool dir
    ctld, slurmd = _free_ports(nodes)
    env = {**os.environ, "SLURM_CLUSTER_DIR": d, "SLURM_CTLD_PORT": str(ctld), "SLURMD_PORT": str(slurmd),
           "SLURM_NODES": str(nodes)}
    try:
        t0 = time.time()
        p = subprocess.run([script, "start"], env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"cluster did not start:\n{p.stdout}\n{p.stderr}"
        print(f"slurm cluster of {nodes} node(s) up in {time.time() - t0:.1f}s ({d})")
        yield {"SLURM_CONF": os.path.join(d, "slurm.conf"),
               "PATH": os.path.join(d, "bin") + os.pathsep + os.environ.get("PATH", "")}
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, text=True, timeout=120)
        shutil.rmtree(d, ignore_errors=True)

