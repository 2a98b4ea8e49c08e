"""Hydra finds launchers only in the `hydra_plugins` namespace: conf/hydra/launcher/slurm.yaml names this class; the
checks it adds to submitit's Slurm launcher live in primus/launch/submit.py."""
from primus.launch.submit import CheckedSlurmLauncher


class PrimusSlurmLauncher(CheckedSlurmLauncher):
    pass
