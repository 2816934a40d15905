"""The package version (a leaf module, so every layer can read it)."""

__version__ = "0.2.0"
