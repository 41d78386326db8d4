"""`Node`: the frozen pydantic base of every value parsed from a scenario file.

A node keeps where it came from (`span`, and `field_spans` per written setting) aside from its
value: positions are excluded from `model_dump()`, from the JSON Schema and from equality, because
formatting a file moves text around and `parse(fmt(x)) == parse(x)` must still hold.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from cptest.errors import Span


class Node(BaseModel):
    """Common base: frozen, no unknown fields, positions kept aside from the value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    span: SkipJsonSchema[Span | None] = Field(default=None, exclude=True, repr=False)
    """Where the node's statement or block starts (None when built in code)."""
    field_spans: SkipJsonSchema[dict[str, Span]] = Field(default_factory=dict, exclude=True, repr=False)
    """Where each explicitly written setting is; a default has no entry."""

    def __eq__(self, other: object) -> bool:
        # Compare values only: spans differ between a file and its formatted form.
        if not isinstance(other, Node) or type(self) is not type(other):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash((type(self).__name__, json.dumps(self.model_dump(mode="json"), sort_keys=True)))

    def where(self, field: str) -> Span | None:
        """The span of `field` if it was written, else the node's own span."""
        return self.field_spans.get(field, self.span)
