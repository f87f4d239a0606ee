"""The base of every config section: a key the model does not declare is an error (a typo is not
silently ignored), and a loaded config is frozen (no code rewrites a setting after validation)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
