"""mgft-doctor: diagnose multi-GPU fine-tuning before it runs (probes) and after it fails (explain)."""

__version__ = "0.1.0"
