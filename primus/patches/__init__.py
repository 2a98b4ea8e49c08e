"""Runtime patches for upstream defects; each module documents what it works around."""


def apply_rocm_patches() -> bool:
    """Install the ROCm workarounds; a no-op (returns False) anywhere else."""
    from .triton_bufops_hook import install

    return install()
