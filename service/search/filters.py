"""A request's metadata filters, parsed and checked once.

The JSON body's filters arrive validated by the request schema (``service.schemas.Filters``); the image
form's arrive as JSON text and are validated here by the same schema. Either way ``SearchFilters`` holds
them in the plain form the index's ``filter_rows`` takes and the result cache's key digests, and checks
their field names against the served version once, when it asks for the matching rows. (The index checks
names again: that is the engine's own guard for every caller, not a second check of the service's.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, TypeAdapter, ValidationError

from service.errors import InvalidInputError, public_loc
from service.index_holder import Served
from service.json_limits import JsonLimitError, parse_json
from service.schemas import Filters, FilterValue

_FILTERS = TypeAdapter(Filters)
T = TypeVar("T")


@dataclass(frozen=True)
class SearchFilters:
    """Filters as plain JSON values: ``{field: scalar | [scalars] | {"gte": x, "lt": y, ...}}``."""

    plain: dict[str, Any]

    @classmethod
    def of(cls, filters: Mapping[str, FilterValue] | None) -> SearchFilters | None:
        """From schema-validated filters; None when there are none (``{}`` included: no filter at all)."""
        if not filters:
            return None
        return cls(
            {
                name: value.model_dump(exclude_none=True) if isinstance(value, BaseModel) else value
                for name, value in filters.items()
            }
        )

    @classmethod
    def from_form(cls, text: str | None) -> SearchFilters | None:
        """From a form field's JSON text (the image search), validated as the JSON body's filters are; a 422
        naming ``filters`` when it is not a JSON object of filters."""
        if not text:
            return None
        return cls.of(form_json(text, _FILTERS, "filters", "a JSON object of filters"))

    def rows(self, served: Served) -> np.ndarray:
        """The served version's live rows matching every filter; a 422 naming the field for a field this
        version does not have."""
        known = served.index.fields
        for name in self.plain:
            if name not in known:
                raise InvalidInputError(
                    f"unknown filter field {name!r}; known fields: {', '.join(sorted(known)) or 'none'}",
                    loc=("body", "filters", name),
                )
        return served.index.filter_rows(self.plain)


def form_json(text: str, adapter: TypeAdapter[T], field: str, what: str) -> T:
    """A multipart form field's JSON text (the image search's ``filters``, ``facets``) validated by
    ``adapter`` as the JSON body's field is; a 422 naming ``field`` ("``field`` must be ``what``: why")."""
    try:
        return adapter.validate_python(parse_json(text))
    except JsonLimitError as exc:
        raise InvalidInputError(f"{field} must be {what}: {exc}", loc=("body", field)) from None
    except ValidationError as exc:
        raise InvalidInputError(f"{field} must be {what}: {describe(exc)}", loc=("body", field)) from None


def describe(exc: ValidationError, most: int = 3) -> str:
    """A validation error in a sentence: where and what, without pydantic's internals (its class names,
    input echoes, documentation links)."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False)[:most]:
        where = ".".join(str(part) for part in public_loc(error))
        parts.append(f"{where or 'value'}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def allowed_rows(filters: SearchFilters | None, served: Served) -> np.ndarray | None:
    """Rows a search may return: None (all) without filters."""
    return None if filters is None else filters.rows(served)
