"""JSON output of the adapters and replay: orjson, and the standard library when orjson refuses a value.

orjson refuses integers outside 64 bits (``--after-step 18446744073709551616`` in a failed
result document) and nesting deeper than 255 levels (a tool argument or result nested 600
deep); the standard library writes both. The fallback uses compact separators (or an indent of
2), ``ensure_ascii=False`` (``\\uXXXX`` escapes only for strings that are not valid UTF-8), and
sorts keys when asked, so that for the values both accept the bytes are the same as orjson's.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def _std(obj: Any, indent: bool, sort_keys: bool) -> bytes:
    kw: dict[str, Any] = {"indent": 2} if indent else {"separators": (",", ":")}
    try:
        return json.dumps(obj, ensure_ascii=False, sort_keys=sort_keys, **kw).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escape it rather than write invalid UTF-8
        return json.dumps(obj, ensure_ascii=True, sort_keys=sort_keys, **kw).encode("ascii")


def dumps(obj: Any, *, indent: bool = False, sort_keys: bool = False) -> bytes:
    """``obj`` as JSON bytes: orjson (compact, or indented by 2), else the standard library.
    Raises ValueError when neither can write it (nesting past Python's recursion limit)."""
    opt = orjson.OPT_NON_STR_KEYS
    if indent:
        opt |= orjson.OPT_INDENT_2
    if sort_keys:
        opt |= orjson.OPT_SORT_KEYS
    try:
        return orjson.dumps(obj, option=opt)
    except TypeError:
        pass
    try:
        return _std(obj, indent, sort_keys)
    except RecursionError:
        raise ValueError("a value is nested too deeply to be written as JSON") from None
