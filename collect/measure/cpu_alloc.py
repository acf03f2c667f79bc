"""The CPU's max_memory_allocated: a counting allocator installed as torch's CPU allocator.

``install()`` builds (once per source version, cached by torch in
~/.cache/torch_extensions or $TORCH_EXTENSIONS_DIR; about 30 s the first time)
and installs collect/csrc/counting_allocator.cpp. From then on every CPU
tensor allocation of this process, on any thread, is counted: ``live_bytes()``,
``peak_bytes()``, ``reset_peak()``. Tensors allocated before installation are
freed by their own allocator and never counted.
"""

from __future__ import annotations

import functools
import time
import warnings
from pathlib import Path

SOURCE = Path(__file__).parent / "csrc" / "counting_allocator.cpp"
NAME = "plansight_counting_allocator"
STALE_LOCK_S = 600.0  # a build takes ~30 s: a lock this old was left by a build killed mid-way


@functools.cache
def _extension():
    # lazy: only processes that measure CPU memory pay for the build check and the compiler
    from torch.utils.cpp_extension import _get_build_directory, load

    clear_stale_lock(Path(_get_build_directory(NAME, verbose=False)))
    return load(NAME, [str(SOURCE)], extra_cflags=["-O2"], verbose=False)


def clear_stale_lock(build_dir: Path) -> bool:
    """Remove the build lock a killed build left behind: torch's loader would wait on it for ever."""
    lock = build_dir / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < STALE_LOCK_S:
        return False  # another process may be building right now
    warnings.warn(f"removing {lock}: left {age:.0f} s ago by a build that did not finish", stacklevel=2)
    lock.unlink(missing_ok=True)
    return True


def build() -> None:
    """Compile the extension if its cached build is missing or stale (the parent does this before spawning
    ranks, so they only load it)."""
    _extension()


@functools.cache
def install() -> None:
    """Make the counting allocator torch's CPU allocator in this process (idempotent)."""
    _extension().install()


def live_bytes() -> int:
    return _extension().live_bytes()


def peak_bytes() -> int:
    return _extension().peak_bytes()


def reset_peak() -> None:
    """Start a new high-water mark at the bytes live now."""
    _extension().reset_peak()
