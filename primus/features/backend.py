"""The backend feature: its config, rules and backend mapping (see primus/features/__init__.py)."""
