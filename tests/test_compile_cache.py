"""primus.patches.compile_cache: torch.compile's on-disk caches are keyed by primus.turbo's sources too.

The upstream gap is reproduced first, in subprocesses sharing one inductor cache directory: a graph compiled
against a custom op's old schema is served to a process whose op has a new one, and fails there; a different
cache_key_tag (what primus sets from its sources) compiles afresh instead.
"""
import os
import subprocess
import sys

import pytest

STALE = r'''
import sys
import torch
import torch.compiler.config as cconfig
schema, cconfig.cache_key_tag = sys.argv[1], sys.argv[2]
if schema == "old":
    @torch.library.custom_op("primustest::scale", mutates_args=())
    def scale(x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return x * 2
else:  # the same op with its optional argument dropped
    @torch.library.custom_op("primustest::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2
@scale.register_fake
def _(x, *rest):
    return torch.empty_like(x)
print("OK", torch.compile(lambda x: scale(x.sin()).cos())(torch.ones(8))[0].item())
'''


@pytest.mark.e2e
def test_a_changed_custom_op_is_served_a_stale_graph_unless_the_cache_key_tag_differs(tmp_path):
    script = tmp_path / "stale.py"
    script.write_text(STALE)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}

    def run(schema, tag):
        return subprocess.run([sys.executable, str(script), schema, tag], env=env, capture_output=True, text=True,
                              timeout=300)

    assert "OK" in run("old", "a").stdout
    stale = run("new", "a")  # same tag: the old schema's compiled call, against the new op
    assert stale.returncode != 0 and "expected at most 1 argument(s) but received 2" in stale.stderr, stale.stderr
    fresh = run("new", "b")  # another tag (primus': another fingerprint of its sources): compiled anew
    assert fresh.returncode == 0 and "OK" in fresh.stdout, fresh.stderr


@pytest.fixture
def cache_key_tag():
    import torch.compiler.config as cconfig

    saved = cconfig.cache_key_tag
    yield cconfig
    cconfig.cache_key_tag = saved


def test_importing_the_turbo_kernels_tags_the_caches_with_their_sources(cache_key_tag):
    from primus.patches import compile_cache
    from primus.turbo import _common  # noqa: F401  (the import tags)

    tag = f"primus-turbo-{compile_cache.sources_fingerprint()}"
    assert tag in cache_key_tag.cache_key_tag.split("|")
    cache_key_tag.cache_key_tag = "users-own"
    assert compile_cache.tag_compile_caches() == f"users-own|{tag}"  # the user's tag kept
    assert compile_cache.tag_compile_caches() == f"users-own|{tag}"  # once


def test_fingerprint_follows_the_sources(tmp_path):
    from primus.patches.compile_cache import sources_fingerprint

    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("ignored")
    first = sources_fingerprint(str(tmp_path))
    assert len(first) == 16 and sources_fingerprint(str(tmp_path)) == first
    (tmp_path / "notes.txt").write_text("still ignored")
    assert sources_fingerprint(str(tmp_path)) == first
    (tmp_path / "a.py").write_text("x = 2\n")
    second = sources_fingerprint(str(tmp_path))
    assert second != first
    (tmp_path / "a.py").rename(tmp_path / "b.py")  # same bytes, another module
    assert sources_fingerprint(str(tmp_path)) not in (first, second)
