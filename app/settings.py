"""Settings from the environment (LOCALINFER_*), read when asked for, never at import."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import platformdirs
from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["DEFAULT_CTX", "DEFAULT_MODEL", "KEEP_ALIVE", "ServeSettings", "Settings"]

DEFAULT_MODEL = "smollm2:135m"  # embedded in the package (model_store.sources.EMBEDDED)
DEFAULT_CTX = 4096  # context tokens per chat when none is asked for (within the model's)
KEEP_ALIVE = "5m"  # how long a server keeps an idle model loaded


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOCALINFER_", extra="ignore")

    home: Path = Field(
        default_factory=lambda: platformdirs.user_data_path("localinfer"),
        description="where models and data live (LOCALINFER_HOME)",
    )
    default_model: str = Field(DEFAULT_MODEL, description="the model `run` uses when none is named")
    # LOCALINFER_CTX, as `serve --ctx` reads it (LOCALINFER_DEFAULT_CTX, its old name, too)
    ctx: int = Field(DEFAULT_CTX, ge=16, description="context tokens per chat when --ctx is "
                     "not given", validation_alias=AliasChoices("ctx", "LOCALINFER_CTX",
                                                                "LOCALINFER_DEFAULT_CTX"))
    # a base model, or a model caught in a loop, writes until the context is full: minutes
    # of junk. 0: no cap, a reply ends when the context is full
    max_tokens: int = Field(2048, ge=0, description="the longest reply when a client sets "
                                                    "no limit (LOCALINFER_MAX_TOKENS)")

    @property
    def models_dir(self) -> Path:
        return self.home / "models"


class ServeSettings(BaseSettings):
    """`localinfer serve`: each field is also LOCALINFER_<FIELD>; command-line options win."""

    model_config = SettingsConfigDict(env_prefix="LOCALINFER_", extra="ignore")

    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(11435, ge=0, le=65535)
    api_key: str | None = Field(None, description="required as a Bearer token when set")
    # comma-separated in the environment: LOCALINFER_ALLOWED_ORIGINS=http://a.example,http://b
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list,
                                                            description="CORS origins")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Host header names besides loopback ones")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    header_timeout: float = Field(10.0, gt=0, description="seconds a client has to send a "
                                                          "request's headers")
    body_timeout: float = Field(60.0, gt=0, description="seconds a client has to send a "
                                                        "request's body after its headers")
    parallel: int = Field(4, ge=1, le=64, description="requests decoded together per model")
    keep_alive: str = Field(KEEP_ALIVE, description="how long an idle model stays loaded")
    max_loaded_models: int = Field(3, ge=1)

    @field_validator("allowed_origins", "allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
