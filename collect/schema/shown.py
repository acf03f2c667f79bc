"""A user's value as an error message may quote it: short whatever was sent, so a 7 MB field never makes a 7 MB
answer (or a 7 MB line on a terminal)."""

from __future__ import annotations


def shown(value, limit: int = 60) -> str:
    """``repr(value)``, or its first ``limit`` characters and how long it is: ``'xxxx... (7000002 chars)'``."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's digit limit for str()
        return f"<an integer of {value.bit_length()} bits>"
    except RecursionError:
        return f"<a {type(value).__name__} nested too deeply to show>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"
