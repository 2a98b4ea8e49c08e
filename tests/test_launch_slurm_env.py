"""primus.launch.slurm: a Slurm task's rank and rendezvous env (no cluster needed) and the Slurm launcher config."""
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import primus.launch.slurm as pslurm
from primus.launch.slurm import node_address, slurm_task_env, task_rank

CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")

# what Slurm + submitit put in the env of task 3 of a 2-node x 2-task job (node 2, second task)
TASK3 = {
    "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_ARRAY_JOB_ID": "", "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu-node[07-08]", "SLURM_STEP_NODELIST": "gpu-node[07-08]",
    "CUDA_VISIBLE_DEVICES": "0,1",
}
CLEAR = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_ARRAY_TASK_ID",
         "SLURM_ARRAY_JOB_ID")


class FakeScontrol:
    """`scontrol -o show node NAME` as Slurm answers it; records the calls (no process is started)."""

    def __init__(self, addrs):
        self.addrs, self.calls = addrs, []

    def __call__(self, cmd, **kw):
        import subprocess

        self.calls.append(cmd)
        name = cmd[-1]
        out = f"NodeName={name} Arch=x86_64 NodeAddr={self.addrs[name]} NodeHostName=vm" if name in self.addrs else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")


@pytest.fixture
def slurm_env(monkeypatch):
    for k in CLEAR:
        monkeypatch.delenv(k, raising=False)
    # the example nodes do not resolve here: scontrol knows no address for them either
    monkeypatch.setattr(pslurm.subprocess, "run", FakeScontrol({}))

    def set_env(**over):
        for k, v in {**TASK3, **over}.items():
            if v == "":
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, v)
    return set_env


def test_task_env_from_slurm(slurm_env):
    slurm_env()
    env = slurm_task_env()
    assert env is not None
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "4"
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "1"
    assert env["MASTER_ADDR"] == "gpu-node07"  # first host of the job
    assert 20000 <= int(env["MASTER_PORT"]) <= 60000
    # CUDA_VISIBLE_DEVICES is left alone: set_device(LOCAL_RANK) needs every GPU of the node visible
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert task_rank() == 3


def test_master_port_is_shared_by_the_tasks_of_a_job_and_differs_between_jobs(slurm_env):
    slurm_env(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0")
    p0 = slurm_task_env()["MASTER_PORT"]
    slurm_env(SLURM_PROCID="3")
    p3 = slurm_task_env()["MASTER_PORT"]
    slurm_env(SLURM_JOB_ID="4243")
    other = slurm_task_env()["MASTER_PORT"]
    assert p0 == p3 != other


def test_master_port_from_env_wins(slurm_env, monkeypatch):
    slurm_env()
    monkeypatch.setenv("MASTER_PORT", "29555")
    assert slurm_task_env()["MASTER_PORT"] == "29555"


def test_no_task_env_outside_a_multi_task_submitit_job(slurm_env, monkeypatch):
    slurm_env(SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_NUM_NODES="1",
              SLURM_JOB_NODELIST="n1", SLURM_STEP_NODELIST="n1")
    assert slurm_task_env() is None  # one task: run.py starts launcher.nproc_per_node local workers as usual
    slurm_env()
    monkeypatch.delenv("SUBMITIT_EXECUTOR")
    assert slurm_task_env() is None  # a plain sbatch/srun job is not ours to rewire


def test_one_gpu_per_task_masking_is_warned_about(slurm_env, capsys):
    slurm_env(CUDA_VISIBLE_DEVICES="1")
    slurm_task_env()
    assert "gpus_per_node" in capsys.readouterr().err


def _launcher(overrides):
    from primus.config.hydra_compat import quote_numeric_group_choices

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=quote_numeric_group_choices(list(overrides)), return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


def test_slurm_launcher_one_task_per_gpu():
    la = _launcher(["hydra/launcher=slurm", "launcher.nproc_per_node=8", "launcher.nnodes=4"])
    assert la["_target_"].endswith("SlurmLauncher")
    assert la["tasks_per_node"] == 8 and la["gpus_per_node"] == 8 and la["nodes"] == 4
    assert la["submitit_folder"].endswith("/.submitit/%j")


@pytest.mark.parametrize("cluster", ["local", "h200", "mi300x"])
def test_cluster_presets(cluster):
    la = _launcher(["hydra/launcher=slurm", f"+cluster={cluster}", "launcher.nproc_per_node=2"])
    assert la["tasks_per_node"] == 2
    assert isinstance(la["setup"], list) and la["setup"]
    if cluster == "local":
        assert la["partition"] == "debug" and la["gpus_per_node"] is None and la["cpus_per_task"] == 1
    else:
        assert la["gpus_per_node"] == 2


def test_run_and_sweep_dirs_have_sub_second_timestamps():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", return_hydra_config=True)
    h = OmegaConf.to_container(cfg.hydra, resolve=False)
    assert "%f" in h["run"]["dir"] and "%f" in h["sweep"]["dir"]
    assert h["callbacks"]["primus_sweep"]["_target_"] == "primus.sweep.SweepCallback"


def test_node_name_that_is_no_host_name_goes_by_its_node_addr(monkeypatch):
    """Two slurmd daemons on one machine (nodes node1, node2 of launchers/slurm_cluster.sh with SLURM_NODES=2):
    the first node's name does not resolve, so the rendezvous address is its NodeAddr; a resolvable name is kept
    as it is, without asking scontrol."""
    fake = FakeScontrol({"node-unresolvable-1": "127.0.0.1"})
    monkeypatch.setattr(pslurm.subprocess, "run", fake)
    assert node_address("node-unresolvable-1") == "127.0.0.1"
    assert fake.calls == [["scontrol", "-o", "show", "node", "node-unresolvable-1"]]
    assert node_address("localhost") == "localhost" and len(fake.calls) == 1
    assert node_address("node-unresolvable-2") == "node-unresolvable-2"  # scontrol does not know it: the name
