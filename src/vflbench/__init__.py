"""vflbench: train, attack, defend and evaluate vertical federated learning."""

__version__ = "0.1.0"
