"""Request and response models of the merchandising rules' admin routes (``service.api.routes.rules``; they
are the OpenAPI schema), with their limits. A rule's actions use the search filters' own syntax
(``service.schemas.Filters``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag

from service.schemas import Filters, LangCode, QueryText, UnicodeText

MAX_RULES = 100  # per index: every search compares its query with each enabled rule (one matrix product)
MAX_ACTIONS = 10  # per rule
MAX_PIN_POSITION = 100  # 1-based; a deeper pin is past any page a shopper reads
MAX_ITEM_ID_CHARS = 512
RECOMMENDED_THRESHOLD = 0.7  # measured on the shared grocery half (docs/how-to/products-and-hybrid-search.md)
RuleId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
ItemId = Annotated[UnicodeText, StringConstraints(min_length=1, max_length=MAX_ITEM_ID_CHARS)]
RuleFilters = Annotated[Filters, Field(min_length=1)]  # a rule's filter names at least one field
Weight = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]


class PinAction(BaseModel):
    """Show product ``pin`` at ``position`` (1 = the first result) whenever the rule acts."""

    model_config = ConfigDict(extra="forbid")
    pin: ItemId = Field(description="A product id of the index.")
    position: int = Field(ge=1, le=MAX_PIN_POSITION, description="1-based place in the results.")


class BoostAction(BaseModel):
    """Raise the candidates matching the filter by ``weight`` on the fused score's scale, normalised to
    [0, 1] over the query's candidates (1: above every candidate that does not match)."""

    model_config = ConfigDict(extra="forbid")
    boost: RuleFilters
    weight: Weight


class BuryAction(BaseModel):
    """Lower the candidates matching the filter by ``weight`` (the scale of ``boost``)."""

    model_config = ConfigDict(extra="forbid")
    bury: RuleFilters
    weight: Weight


class HideAction(BaseModel):
    """Drop the products matching the filter from the results (a pinned one too)."""

    model_config = ConfigDict(extra="forbid")
    hide: RuleFilters


KINDS = ("pin", "boost", "bury", "hide")


def _kind(value: Any) -> str | None:
    """Which action an object is, by the key naming it (None: none of them, a 422 saying so)."""
    if isinstance(value, dict):
        return next((k for k in KINDS if k in value), None)
    if isinstance(value, BaseModel):
        return next((k for k in KINDS if hasattr(value, k)), None)
    return None


Action = Annotated[
    Annotated[PinAction, Tag("pin")]
    | Annotated[BoostAction, Tag("boost")]
    | Annotated[BuryAction, Tag("bury")]
    | Annotated[HideAction, Tag("hide")],
    Discriminator(
        _kind,
        custom_error_type="rule_action",
        custom_error_message="an action is an object naming one of pin (with position), boost or bury (with "
        "weight), or hide",
    ),
]


class RuleBody(BaseModel):
    """A rule as written (``PUT /v1/admin/indexes/{name}/rules/{rule_id}``)."""

    model_config = ConfigDict(extra="forbid")
    query: QueryText = Field(description="The query the rule is written for, in any language.")
    lang: LangCode | None = Field(None, description="The rule query's language; detected when unset.")
    threshold: float = Field(
        RECOMMENDED_THRESHOLD,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="The rule acts on a search whose query's embedding has at least this cosine with the "
        f"rule query's (the multilingual text encoder's); {RECOMMENDED_THRESHOLD} recommended.",
    )
    actions: Annotated[list[Action], Field(min_length=1, max_length=MAX_ACTIONS)]
    enabled: bool = True


class Rule(RuleBody):
    id: RuleId


class RuleList(BaseModel):
    rules: list[Rule]
    etag: str = Field(description="Identifies the rules' content ('' when none was ever written).")
    limits: dict[str, int] = Field(description="max_rules, max_actions, max_pin_position.")


LIMITS = {"max_rules": MAX_RULES, "max_actions": MAX_ACTIONS, "max_pin_position": MAX_PIN_POSITION}
