"""The one base of every wire model: unknown fields are an error (-32602), never a silently ignored option."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Strict"]


class Strict(BaseModel):
    """A params or result model that forbids unknown fields."""

    model_config = ConfigDict(extra="forbid")
