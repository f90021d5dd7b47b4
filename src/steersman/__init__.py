"""steersman: an inference control plane for LLM fleets."""

__version__ = "0.1.0"
