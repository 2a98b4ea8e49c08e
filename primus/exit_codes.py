"""One exit-code table for every way a run ends (docs/launching.md), whatever the launcher or process count."""
OK = 0
FAILED = 1  # an error during the run: result.json says which
BAD_CONFIG = 2  # refused before anything started: the message names each key, value and fix
PREEMPTED = 75  # stopped by a signal with a checkpoint: resume me (EX_TEMPFAIL, "try again later")
