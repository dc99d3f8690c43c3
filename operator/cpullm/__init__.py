"""cpullm-operator: plans and serves LLMs on CPU-only Kubernetes clusters with vLLM's CPU backend."""

__version__ = "0.1.0"
