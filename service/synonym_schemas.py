"""Request and response models of the synonyms admin route (``service.api.routes.synonyms``); the format
and its limits are the store's (``store.synonyms``), stated here again as the OpenAPI schema's bounds."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from service.schemas import LangCode, UnicodeText
from store.synonyms import MAX_ENTRIES, MAX_TERM_CHARS, MAX_TERM_WORDS, MAX_TERMS

Term = Annotated[UnicodeText, StringConstraints(min_length=1, max_length=MAX_TERM_CHARS)]
_TERM = f"A word or phrase of at most {MAX_TERM_CHARS} characters and {MAX_TERM_WORDS} words."


class TwoWaySynonyms(BaseModel):
    """Terms that each stand for the others ("sneakers" = "trainers")."""

    model_config = ConfigDict(extra="forbid")
    terms: list[Term] = Field(min_length=2, max_length=MAX_TERMS, description=f"2-{MAX_TERMS} terms. {_TERM}")
    lang: LangCode | None = Field(None, description="The query language it applies to; default: every one.")


class OneWaySynonyms(BaseModel):
    """A term that also searches its targets, not the other way ("tee" -> "t-shirt")."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: Term = Field(alias="from", description=_TERM)
    to: list[Term] = Field(min_length=1, max_length=MAX_TERMS, description=f"1-{MAX_TERMS} terms. {_TERM}")
    lang: LangCode | None = Field(None, description="The query language it applies to; default: every one.")


class SynonymsDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")
    synonyms: list[TwoWaySynonyms | OneWaySynonyms] = Field(
        max_length=MAX_ENTRIES,
        description=f"At most {MAX_ENTRIES} entries; one-way entries may not form a cycle within a language.",
    )


class SynonymsResponse(BaseModel):
    index: str
    synonyms: list[TwoWaySynonyms | OneWaySynonyms] = Field(
        description="The index-level set (this route's; kept across rebuilds)."
    )
    stored: bool = Field(description="Whether an index-level set is stored.")
    version: str | None = Field(None, description="The served version.")
    version_synonyms: list[TwoWaySynonyms | OneWaySynonyms] = Field(
        default_factory=list,
        description="The served version's own set (ccrk index build --synonyms); the index-level set decides "
        "any term it defines for the same language.",
    )
    problem: str | None = Field(None, description="Why a stored set is not used (damaged or hand-edited).")
