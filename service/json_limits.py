"""Bounds on JSON the service parses itself (form fields: the image search's ``filters``).

FastAPI parses JSON bodies (and refuses what it cannot parse with a 4xx); text the service hands to
``json.loads`` itself is checked here first, by size and by nesting depth, without recursion: a 12 KB form
field nested 3,000 levels deep made ``json.loads`` raise ``RecursionError``, which nothing caught (a 500).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

MAX_JSON_BYTES = 64 * 1024
MAX_JSON_DEPTH = 32
# A JSON string (closed), escapes included: its brackets are text, not nesting.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


class JsonLimitError(ValueError):
    """JSON text too large, too deeply nested or not JSON; the message says which."""


def nesting_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in ``text`` (brackets inside strings ignored), computed without
    recursion. Text that is not JSON gets some depth; ``json.loads`` then refuses it."""
    bare = _STRING.sub("", text).encode("utf-8", "replace")
    codes = np.frombuffer(bare, dtype=np.uint8)
    opens = (codes == ord("[")) | (codes == ord("{"))
    closes = (codes == ord("]")) | (codes == ord("}"))
    steps = opens.astype(np.int32) - closes.astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def parse_json(text: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)`` once the text is known to be at most ``max_bytes`` (UTF-8) and nested at most
    ``max_depth`` levels; ``JsonLimitError`` otherwise (never ``RecursionError``)."""
    size = len(text.encode("utf-8", "replace"))
    if size > max_bytes:
        raise JsonLimitError(f"JSON text of {size:,} bytes; at most {max_bytes:,} are accepted")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JsonLimitError(f"JSON nested {depth} levels deep; at most {max_depth} are accepted")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError cannot happen below max_depth; kept safe
        raise JsonLimitError(f"not valid JSON: {exc}") from None
