"""Reading what a user hands the command line: a JSON file into a schema model, or one clear line why not.

Every failure is an InputError naming the file and, where there is one, the
field and the rule; the commands print it and exit with status 2. Nothing here
raises anything else on any bytes a file can hold.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

MAX_INPUT_BYTES = 64 * 2**20


class InputError(ValueError):
    """Bad input from the shell; its message is what the user reads."""


def read_json(path: str | Path):
    """The JSON value in ``path`` (UTF-8, at most MAX_INPUT_BYTES)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise InputError(f"error: cannot read {path}: {e.strerror}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise InputError(f"error: {path} is over {MAX_INPUT_BYTES} bytes; a request file is a few KB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"error: {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                         "save it as UTF-8 JSON") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"error: {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise InputError(f"error: {path} is nested too deeply to be a request") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise InputError(f"error: {path} is not valid JSON: {e}") from None


def validation_lines(exc: ValidationError) -> list[str]:
    return [f"  {'.'.join(str(p) for p in e['loc']) or '(request)'}: {e['msg']}" for e in exc.errors()]


def load_model(path: str | Path, model: type[BaseModel]):
    """Read ``path`` and validate it as ``model``; InputError lists every problem with its field."""
    data = read_json(path)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InputError("\n".join([f"error: {path} is not a valid {model.__name__}:", *validation_lines(e)])) from None
    except RecursionError:
        raise InputError(f"error: {path} is nested too deeply to be a {model.__name__}") from None
