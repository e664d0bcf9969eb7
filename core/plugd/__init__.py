"""plugd: a local LLM daemon with Ollama's API, MLX runners and plugins for everything model-specific."""

__version__ = "0.1.0"
