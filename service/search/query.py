"""A query's text as it is encoded, and the digests the caches key on."""

from __future__ import annotations

import hashlib
import json
import unicodedata


def normalise_query(text: str) -> str:
    """NFKC and collapsed whitespace: the text that is encoded and the cache key (case is kept: the
    tokenizer is case-sensitive)."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def digest(payload: object) -> str:
    """A cache key's digest of JSON-able parts (key order does not matter)."""
    data = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()
