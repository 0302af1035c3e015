"""OpenAI's attribute filters for vector store search and `file_search`: a comparison
(`{"type": "eq", "key": "author", "value": "Ada"}`; eq, ne, gt, gte, lt, lte, in, nin) or a
compound (`{"type": "and" | "or", "filters": [...]}`), matched against a file's attributes."""
from __future__ import annotations

import operator

from engine.server.errors import APIError

_COMPARE = {"eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "gte": operator.ge,
            "lt": operator.lt, "lte": operator.le, "in": lambda a, b: a in b, "nin": lambda a, b: a not in b}


def matches(f: dict, attributes: dict) -> bool:
    kind = f.get("type")
    if kind in ("and", "or"):
        parts = f.get("filters")
        if not isinstance(parts, list):
            raise APIError(400, f"a {kind!r} filter needs a list of filters", code="invalid_value", param="filters")
        results = (matches(p, attributes) for p in parts)
        return all(results) if kind == "and" else any(results)
    if kind not in _COMPARE or "key" not in f:
        raise APIError(400, f"unknown filter {f!r}: use eq, ne, gt, gte, lt, lte, in, nin with a key, or and/or",
                       code="invalid_value", param="filters")
    if f["key"] not in attributes:
        return kind in ("ne", "nin")
    try:
        return bool(_COMPARE[kind](attributes[f["key"]], f.get("value")))
    except TypeError:  # "3" > 2: values of different kinds never match
        return False
