"""Workaround: torch.compile's on-disk caches key a graph by its own code, not by the custom ops it calls.

Upstream behaviour (torch 2.11-2.13): inductor's FX graph cache and AOT autograd's cache hash the traced graph, its
inputs and the compile configuration. A call to a custom op enters that key as the op's name and arguments only;
the op's schema, its fake kernel and its Python body do not. So after one of primus' ops changes (an argument added
or dropped, an output's declared layout), a process that finds an entry compiled against the old op in the cache
directory (`/tmp/torchinductor_<user>` unless TORCHINDUCTOR_CACHE_DIR says otherwise, shared by every run of that
user) runs the old compiled call against the new op. Seen on the H200 (2026-12-03), after a schema change was reverted:
`primus::fp8_linear_fwd() expected at most 4 argument(s) but received 5`, from a compiled megatron layer.

`torch.compiler.config.cache_key_tag` is "included in the cache key generation for all torch compile caching",
for breaking caches: it gets a fingerprint of the primus.turbo sources (the modules that define the custom ops,
their fake kernels, and the helpers those use), so a graph compiled against another version of them is never
served. A tag the user set is kept; ours is appended to it.
"""
from __future__ import annotations

import functools
import hashlib
import os

TURBO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "turbo")


def sources_fingerprint(directory: str = TURBO_DIR) -> str:
    """16 hex digits of a hash of the .py files in `directory` (names and contents, in name order)."""
    h = hashlib.sha256()
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".py")):
        h.update(name.encode() + b"\0")
        with open(os.path.join(directory, name), "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _tag() -> str:
    return f"primus-turbo-{sources_fingerprint()}"


def tag_compile_caches() -> str:
    """Append primus' tag to torch.compiler.config.cache_key_tag (once); returns the tag in force."""
    import torch.compiler.config as cconfig

    if not hasattr(cconfig, "cache_key_tag"):  # a torch without the tag has none of these caches keyed by it
        return ""
    tag, current = _tag(), cconfig.cache_key_tag
    if tag not in current.split("|"):
        cconfig.cache_key_tag = f"{current}|{tag}" if current else tag
    return cconfig.cache_key_tag
