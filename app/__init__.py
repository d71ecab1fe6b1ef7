"""localinfer: run large language models on your own machine."""

__version__ = "0.1.0"
__all__ = ["__version__"]
