"""primus.launch.dist.barrier: the project's own barrier names the GPU under NCCL (torch guesses it and warns
otherwise) and none under gloo (which refuses device ids)."""
import subprocess
import sys

import pytest
import torch

from primus.launch import dist as pdist


def test_outside_torch_distributed_it_returns_at_once():
    import torch.distributed as d

    assert not d.is_initialized()
    pdist.barrier()


@pytest.mark.parametrize("backend, expected", [("nccl", {"device_ids": [3]}),
                                               ("cpu:gloo,cuda:nccl", {"device_ids": [3]}), ("gloo", {})])
def test_the_device_ids_follow_the_backend(monkeypatch, backend, expected):
    import torch.distributed as d

    seen = []
    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(d, "barrier", lambda **kw: seen.append(kw))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    pdist.barrier()
    assert seen == [expected]


@pytest.mark.e2e
def test_two_gloo_ranks_meet(tmp_path):
    """Rank 1 leaves a mark just before the barrier, late; rank 0 must find it right after the barrier."""
    code = ("import os, sys, time, torch.distributed as d\n"
            "from primus.launch.dist import barrier\n"
            "r, tmp = int(sys.argv[1]), sys.argv[2]\n"
            "d.init_process_group('gloo', init_method='file://' + tmp + '/store', rank=r, world_size=2)\n"
            "if r: time.sleep(1.0); open(tmp + '/mark', 'w').close()\n"
            "barrier(); print(r, os.path.exists(tmp + '/mark'))\n")
    ps = [subprocess.Popen([sys.executable, "-c", code, str(r), str(tmp_path)], stdout=subprocess.PIPE, text=True)
          for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0].split() for p in ps]
    assert [p.returncode for p in ps] == [0, 0]
    assert outs == [["0", "True"], ["1", "True"]]


@pytest.mark.e2e
@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL needs a GPU (runs on the GPU machine)")
def test_an_nccl_barrier_names_the_gpu_and_torch_does_not_warn():
    """On a GPU: a world of one on NCCL, torch's own barrier warns that it guesses the device; ours does not."""
    code = ("import os, warnings, torch, torch.distributed as d\n"
            "from primus.launch.local import single_process_env\n"
            "from primus.launch.dist import barrier\n"
            "os.environ.update(single_process_env()); torch.cuda.set_device(0); d.init_process_group('nccl')\n"
            "for name, call in (('ours', barrier), ('torch', d.barrier)):\n"
            "    with warnings.catch_warnings(record=True) as w:\n"
            "        warnings.simplefilter('always'); call(); torch.cuda.synchronize()\n"
            "    print(name, any('barrier(): using the device' in str(x.message) for x in w))\n"
            "d.destroy_process_group()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ours", "False", "torch", "True"]
