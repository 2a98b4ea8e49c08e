"""Primus-Hydra: Hydra-composed LLM pretraining performance framework."""
