"""Settings from the environment (LOCALINFER_*), read when asked for, never at import."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from localinfer.model_store.sources import DEFAULT_MODEL

__all__ = ["Settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOCALINFER_", extra="ignore")

    home: Path = Field(
        default_factory=lambda: platformdirs.user_data_path("localinfer"),
        description="where models and data live (LOCALINFER_HOME)",
    )
    default_model: str = Field(DEFAULT_MODEL, description="the model `run` uses when none is named")
    default_ctx: int = Field(4096, ge=16, description="context tokens per chat when --ctx is not given")

    @property
    def models_dir(self) -> Path:
        return self.home / "models"
