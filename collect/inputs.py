"""Reading what a user hands the command line: a JSON file into a schema model, or one clear line why not.

Every failure is an InputError naming the file and, where there is one, the
field and the rule; the commands print it and exit with status 2. Nothing here
raises anything else on any bytes a file can hold.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
from pathlib import Path

from pydantic import BaseModel, ValidationError

from collect.schema import RunSpec, collect_problems
from collect.store import CorruptResultsError, StoreBusyError, StoreWriteError

MAX_INPUT_BYTES = 64 * 2**20


class InputError(ValueError):
    """Bad input from the shell; its message is what the user reads."""


def read_text(path: str | Path) -> str:
    """The text in ``path`` (at most MAX_INPUT_BYTES), decoded as the HTTP service decodes a body (json.loads of
    bytes): UTF-8 with or without a BOM, UTF-16 or UTF-32 by their BOM or their zero bytes."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise InputError(f"error: cannot read {path}: {e.strerror}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise InputError(f"error: {path} is over {MAX_INPUT_BYTES} bytes; a request file is a few KB")
    encoding = json.detect_encoding(raw)
    skip = len(codecs.BOM_UTF8) if encoding == "utf-8-sig" else 0  # so an offset below counts from the file's start
    try:
        return raw[skip:].decode(encoding.removesuffix("-sig"))
    except UnicodeDecodeError as e:
        at, name = skip + e.start, "UTF-8" if encoding.startswith("utf-8") else encoding.upper()
        raise InputError(
            f"error: {path} is not {name} text (byte 0x{raw[at]:02x} at offset {at}); save it as UTF-8"
        ) from None


def read_json(path: str | Path):
    """The JSON value in ``path`` (read_text's encodings, at most MAX_INPUT_BYTES)."""
    text = read_text(path)
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


MAX_LOCAL_RANKS = 64  # processes on one machine: beyond this gloo's setup alone takes minutes
STATE_BYTES_PER_PARAM = 16  # fp32 weights, gradients and AdamW's two moments


def local_problems(spec: RunSpec, memory_bytes: int | None = None) -> list[str]:
    """What the local pool (CPU ranks over gloo on this machine) cannot honour, on top of plan_problems: GPU
    plans are measured under torchrun, and a model whose training state alone is over half this machine's
    memory (``memory_bytes``, default: read from the OS) would only swap."""
    problems = collect_problems(spec.workload, spec.plan, spec.cluster)
    c = spec.cluster
    if c.device != "cpu" or c.backend != "gloo":
        problems.append(
            f"cluster.device {c.device!r} with backend {c.backend!r}: the local pool runs CPU ranks over "
            "gloo; measure GPU plans with `torchrun ... -m collect sweep` on the GPUs"
        )
    if c.world_size > MAX_LOCAL_RANKS:
        problems.append(f"cluster world size {c.world_size} is over the local pool's limit of {MAX_LOCAL_RANKS} ranks")
    memory_bytes = memory_bytes or _machine_memory_bytes()
    state = STATE_BYTES_PER_PARAM * spec.workload.num_params
    if memory_bytes and state > memory_bytes // 2:
        problems.append(
            f"workload: {spec.workload.num_params:.3g} parameters need {state / 2**30:.1f} GiB of training "
            f"state ({STATE_BYTES_PER_PARAM} bytes each), over half of this machine's "
            f"{memory_bytes / 2**30:.1f} GiB"
        )
    return problems


def _machine_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


USAGE_ERROR = 2  # bad input: what argparse itself exits with


def run_reporting_errors(command, *args) -> None:
    """Run a shell command's function; what goes wrong reaches the user as one clear message and an exit status."""
    try:
        command(*args)
    except InputError as exc:
        _fail(str(exc), USAGE_ERROR)
    except ValidationError as exc:
        _fail("\n".join(["error: invalid input", *validation_lines(exc)]), USAGE_ERROR)
    except (CorruptResultsError, StoreBusyError) as exc:
        _fail(f"error: {exc}", USAGE_ERROR)
    except StoreWriteError as exc:
        _fail(f"error: {exc}", 1)
    except OSError as exc:  # writing a fingerprint or the sweep's spec: a full or read-only disk
        _fail(
            f"error: cannot write {exc.filename or 'the output'}: {exc.strerror}; every finished plan is stored, "
            "run the same command again once it is writable",
            1,
        )
    except KeyboardInterrupt:
        _fail("interrupted: every finished plan is stored; run the same command again to resume", 130)


def _fail(message: str, status: int) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(status)
