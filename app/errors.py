"""Every error localinfer raises on purpose, in one tree.

    LocalinferError
    ├── ModelError
    │   ├── ModelNotFound(LookupError)          a name no source knows; carries close names
│   │   └── ModelNotInstalled               a hub model not pulled yet
    │   ├── ModelFileMissing(FileNotFoundError)  a path to a model that does not exist
    │   ├── InvalidModelFile(ValueError)         not GGUF, truncated, or unreadable metadata
    │   └── ModelLoadFailed(RuntimeError)        llama.cpp refused to load a valid-looking file
    ├── ContextError(ValueError)
    │   ├── ContextTooLarge                      n_ctx beyond the model's trained length or RAM
    │   └── PromptTooLong                        the prompt does not fit in the context
    ├── InvalidRequest(ValueError)               bad sampling parameters and the like
    ├── DiskFull                                 no room for a file about to be written
    ├── Cancelled                                the caller gave up (a client went away)
    └── EngineError(RuntimeError)
        ├── EngineBusy                           the wait queue is full; retry later
        ├── EngineClosed                         the engine was shut down
        ├── RunnerDied                           the model's runner process ended (a crash
        │                                        inside llama.cpp, a kill, a hang)
        └── RunnerMismatch                       a runner speaks another protocol version

Messages say what to do, with the numbers. The CLI prints `str(error)` on one line.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "Cancelled",
    "ContextError",
    "ContextTooLarge",
    "EngineBusy",
    "EngineClosed",
    "EngineError",
    "HubError",
    "InvalidModelFile",
    "InvalidRequest",
    "LocalinferError",
    "ModelError",
    "ModelFileMissing",
    "ModelLoadFailed",
    "ModelNotFound",
    "ModelNotInstalled",
    "PromptTooLong",
    "RunnerDied",
    "RunnerMismatch",
    "user_message",
]


class LocalinferError(Exception):
    """Base of every error localinfer raises deliberately."""


class ModelError(LocalinferError):
    """Something is wrong with the model the user asked for."""


class HubError(ModelError):
    """The hub could not be asked, or said no."""


class ModelNotFound(ModelError, LookupError):
    def __init__(self, name: str, suggestions: Sequence[str] = (), known: Sequence[str] = (),
                 hint: str | None = None):
        self.name = name
        self.suggestions = list(suggestions)
        self.known = list(known)
        if not hint:  # else the caller's own words
            hint = ("did you mean " + " or ".join(f"'{s}'" for s in self.suggestions) + "?"
                     if self.suggestions else
                     "available: " + ", ".join(self.known) if self.known else
                     "no models are available")
        super().__init__(f"model '{name}' not found — {hint}")


class ModelNotInstalled(ModelNotFound):
    """A hub model (catalog name or owner/repo) that has not been pulled yet."""

    def __init__(self, hub_ref: object):
        self.hub_ref = hub_ref
        name = getattr(hub_ref, "installed_name", str(hub_ref))
        self.name, self.suggestions, self.known = name, [], []
        LocalinferError.__init__(self, f"'{name}' is not installed — run `localinfer pull {name}`")


class ModelFileMissing(ModelError, FileNotFoundError):
    def __init__(self, path: str):
        self.path = path
        super().__init__(f"no model file at '{path}' — check the path, or give a model name")


class InvalidModelFile(ModelError, ValueError):
    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"'{path}' is not a usable GGUF model: {reason}")


class ModelLoadFailed(ModelError, RuntimeError):
    pass


class ContextError(LocalinferError, ValueError):
    pass


class ContextTooLarge(ContextError):
    pass


class PromptTooLong(ContextError):
    def __init__(self, n_prompt: int, n_ctx: int, at_least: bool = False):
        """at_least: counted from its size, before tokenizing it (it is at least that long)."""
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx
        self.at_least = at_least
        super().__init__(
            f"prompt is {'at least ' if at_least else ''}{n_prompt} tokens but the context "
            f"holds {n_ctx} — raise --ctx or shorten the prompt"
        )


class InvalidRequest(LocalinferError, ValueError):
    pass


class DiskFull(LocalinferError):
    """Not enough free disk for a file localinfer is about to write."""


class Cancelled(LocalinferError):
    """Work done for a caller who went away stops (a pull whose client disconnected)."""


class EngineError(LocalinferError, RuntimeError):
    pass


class EngineBusy(EngineError):
    pass


class EngineClosed(EngineError):
    pass


class RunnerDied(EngineError):
    """A model's runner process ended under its requests; its owner (the model pool) loads it
    again, through the plan, for the next request."""


class RunnerMismatch(EngineError):
    """A runner process speaks another protocol version than its parent (localinfer was
    changed on disk while it ran)."""


def user_message(exc: BaseException) -> str:
    """One line to show a user: a LocalinferError's own text; for the disk's own errors
    (an unwritable or full home, a file in the way), which file and what to check."""
    if isinstance(exc, OSError) and not isinstance(exc, LocalinferError) and exc.filename:
        return (f"cannot use {exc.filename}: {exc.strerror or exc} — check LOCALINFER_HOME "
                f"(where models and data live) and the free disk space")
    return str(exc)
