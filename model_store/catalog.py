"""Model references that point at the Hugging Face hub, and the catalog of short names.

    llama3.2            the catalog's default size, quant chosen by the planner
    llama3.2:1b         a size
    llama3.2:1b-Q8_0    a size and an explicit quant (llama3.2:Q8_0 works too)
    hf.co/owner/repo    any GGUF repo (owner/repo and huggingface.co/owner/repo too)
    hf.co/owner/repo:Q4_K_M
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources

from localinfer.errors import ModelNotFound

__all__ = ["HubRef", "catalog_names", "parse_hub_ref"]

_QUANT = re.compile(r"(?:I?Q\d(?:_[A-Z0-9]+)*|F16|BF16|F32)", re.IGNORECASE)
# (the hub's names begin and end with a letter, digit or _: "./model.gguf" is a path)
_PART = r"\w(?:[\w.-]*\w)?"
_REPO = re.compile(rf"(?:(?:hf\.co|huggingface\.co)/)?({_PART}/{_PART})(?::([\w.-]+))?")


@dataclass(frozen=True)
class HubRef:
    name: str  # what the model is listed under once pulled: "llama3.2:3b", "hf.co/owner/repo"
    repo: str
    quant: str | None  # None: the planner chooses

    @property
    def installed_name(self) -> str:
        """The name in `localinfer list`: an explicit quant is part of it."""
        if self.quant is None:
            return self.name
        return f"{self.name}:{self.quant}" if self.name.startswith("hf.co/") else f"{self.name}-{self.quant}"


@functools.lru_cache(maxsize=1)
def _catalog() -> dict:
    text = resources.files("localinfer.model_store").joinpath("catalog.json").read_text("utf-8")
    return json.loads(text)["models"]


def catalog_names() -> list[str]:
    names = []
    for base, entry in _catalog().items():
        names.append(base)
        names += [f"{base}:{tag}" for tag in entry["tags"]]
    return sorted(names)


def _quant(text: str) -> str | None:
    return text.upper() if _QUANT.fullmatch(text) else None


def parse_hub_ref(ref: str) -> HubRef | None:
    """A hub reference, or None when `ref` is neither a catalog name nor owner/repo."""
    ref = ref.strip()
    repo_match = _REPO.fullmatch(ref)
    if repo_match and "/" in ref:
        repo, quant = repo_match.groups()
        if quant and not _quant(quant):
            raise ModelNotFound(ref, suggestions=[f"hf.co/{repo}:Q4_K_M"])
        return HubRef(f"hf.co/{repo}", repo, _quant(quant) if quant else None)
    base, _, tag = ref.lower().partition(":")
    entry = _catalog().get(base)
    if entry is None:
        return None
    tag = tag.removesuffix("latest").strip("-") or entry["default"]
    quant = None
    if tag not in entry["tags"]:
        size, _, maybe_quant = tag.rpartition("-")
        if _quant(tag):  # llama3.2:Q8_0
            tag, quant = entry["default"], _quant(tag)
        elif size in entry["tags"] and _quant(maybe_quant):  # llama3.2:1b-Q8_0
            tag, quant = size, _quant(maybe_quant)
        else:
            raise ModelNotFound(ref, suggestions=[f"{base}:{t}" for t in entry["tags"]])
    return HubRef(f"{base}:{tag}", entry["tags"][tag], quant)
