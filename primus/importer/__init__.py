"""Primus experiment importer: `python -m primus.importer PRIMUS_EXPERIMENT.yaml [--primus-root DIR] [--out FILE]`.

primus_yaml.py reads Primus's YAML as Primus does; keys.py is the one Primus key -> key here table; models.py maps
Primus's models to presets here; core.py puts them together; write.py writes presets or overrides.
"""
