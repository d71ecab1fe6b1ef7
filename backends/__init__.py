"""Backends: the `Backend` interface and the llama.cpp engine behind it."""

from localinfer.backends.base import (
    Backend,
    DoneEvent,
    ErrorEvent,
    Event,
    Generation,
    LoadOptions,
    ModelInfo,
    SamplingParams,
    TokenEvent,
)
from localinfer.backends.metrics import RequestStats

__all__ = [
    "Backend",
    "DoneEvent",
    "ErrorEvent",
    "Event",
    "Generation",
    "LoadOptions",
    "ModelInfo",
    "RequestStats",
    "SamplingParams",
    "TokenEvent",
]
