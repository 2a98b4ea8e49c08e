"""Workaround: importing TorchTitan's trainer imports Hugging Face `datasets`, which a synthetic-data run never uses.

Upstream behaviour (torchtitan 0.2.2, datasets 5.2): torchtitan/hf_datasets/text_datasets.py starts with
`from datasets import Dataset, load_dataset` and `from datasets.distributed import split_dataset_by_node`, and
`torchtitan.train` imports it (through the model specs and components/validate.py). Importing `datasets` (pyarrow,
pandas, the hub client) costs about 0.9 s of CPU in every TorchTitan process, while only a text dataset (data=jsonl,
Hugging Face data) calls those names.

Applied first by `apply()`: text_datasets is imported with those three names bound to stand-ins that import
`datasets` at their first call or isinstance check (primus/patches/deferred_compile.py, `from_imports`), with
torch.compile deferred as the next workaround does for the rest of the trainer. Checked: when text_datasets no
longer binds them so (another version), the result says so and nothing else changes (a stand-in name it does not
bind is simply not used).
"""
from __future__ import annotations

from primus.backends.torchtitan import PINNED_VERSION
from primus.patches.deferred_compile import _NameOnFirstUse, import_deferring_compile
from primus.patches.registry import Workaround, pin

MODULE = "torchtitan.hf_datasets.text_datasets"
FROM_IMPORTS = {"datasets": ("Dataset", "load_dataset"), "datasets.distributed": ("split_dataset_by_node",)}


def _defer(_cond) -> bool:
    """True where text_datasets now binds every name to a stand-in (datasets not imported by it)."""
    import sys

    if not import_deferring_compile(MODULE, from_imports=FROM_IMPORTS):
        return False
    mod = sys.modules[MODULE]
    return all(isinstance(getattr(mod, n, None), _NameOnFirstUse) for names in FROM_IMPORTS.values() for n in names)


DEFERRED_DATASETS = Workaround(
    "torchtitan.import.deferred_hf_datasets",
    "torchtitan.hf_datasets.text_datasets (from-imports Dataset, load_dataset, split_dataset_by_node at import)",
    "importing Hugging Face datasets costs about 0.9 s of CPU in every TorchTitan process, for names only a text "
    "dataset calls",
    (pin("torchtitan", PINNED_VERSION), pin("datasets", "5.2")), "torchtitan's text_datasets is not imported yet",
    lambda _c: True, _defer)

WORKAROUNDS = (DEFERRED_DATASETS,)
