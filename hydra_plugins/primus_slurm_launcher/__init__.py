"""Hydra finds launchers only in the `hydra_plugins` namespace: conf/hydra/launcher/slurm.yaml names this class; the
checks it adds to submitit's Slurm launcher live in primus/launch/submit.py."""
try:
    from primus.launch.submit import CheckedSlurmLauncher
except ImportError:  # without the slurm extra (hydra-submitit-launcher) there is no Slurm launcher to extend
    CheckedSlurmLauncher = None

if CheckedSlurmLauncher is not None:
    class PrimusSlurmLauncher(CheckedSlurmLauncher):
        pass
