"""The CPU's max_memory_allocated: a counting allocator installed as torch's CPU allocator.

    python -m collect.measure.cpu_alloc --build   # `make install` runs it: build now, or say what to install

collect/measure/csrc/counting_allocator.cpp is compiled once per (source, torch, Python) into a folder of its
own, $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions) / plansight_counting_allocator-<key>, and from
then on imported from there as a plain extension module: loading needs neither ninja nor a compiler. Only a
missing build is compiled, in a child process with a time limit, under a BuildLock that names its holder, says
every 30 s what it waits for, and stops waiting after a time limit. The child holds the lock too, and dies with
its compiler when the process that started it dies, however it dies (SIGKILL included): a killed measure leaves
no compiler behind, and no second build starts in a folder while a compiler still writes there.
Without a compiler or ninja, one line says what to install and
``install()`` returns False: collect.measure.memory then reads CPU peaks from the RSS high-water mark, and
each row says so in its ``peak_mem_method``.

After ``install()`` every CPU tensor allocation of this process, on any thread, is counted: ``live_bytes()``,
``peak_bytes()``, ``reset_peak()``. Tensors allocated before installation are freed by their own allocator
and never counted.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

from collect.measure.build_lock import BuildError, BuildLock

SOURCE = Path(__file__).parent / "csrc" / "counting_allocator.cpp"
NAME = "plansight_counting_allocator"
CFLAGS = ["-O2"]
BUILD_TIMEOUT_S = 600.0  # a build takes ~30 s on a free core; a compiler still running after 10 min is stuck
LOCK_WAIT_S = BUILD_TIMEOUT_S + 60.0  # a live holder stops its own build by BUILD_TIMEOUT_S: this covers it
PARENT_POLL_S = 0.2  # how often a build's child looks whether the process that started it is still there
COMPLETE = "complete"  # written into a build folder once its module built and imported there


class ToolchainMissing(RuntimeError):
    """No compiler or no ninja to build the allocator with; the message says what to install, in one line."""


def build_dir() -> Path:
    """Where this source, built for this torch and this Python, lives: a new key for any change of them."""
    # lazy: torch's extension builder is needed only to find its default cache folder
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    build = (torch.__version__, sys.implementation.cache_tag, sys.abiflags, platform.machine(), " ".join(CFLAGS))
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), *(part.encode() for part in build)])).hexdigest()
    return Path(root) / f"{NAME}-{key[:16]}"


def _tool_path() -> str:
    # the virtualenv's bin holds `pip install ninja`'s ninja, and is not on PATH unless the venv is activated
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def missing_tools() -> str | None:
    """What a build lacks, as one line naming what to install; None when both tools are there."""
    compiler = os.environ.get("CXX", "c++")
    missing = []
    if shutil.which(compiler, path=_tool_path()) is None:
        missing.append(f"no C++ compiler `{compiler}` (apt-get install g++)")
    if shutil.which("ninja", path=_tool_path()) is None:
        missing.append("no `ninja` (pip install ninja)")
    if not missing:
        return None
    return (
        f"cannot build the CPU counting allocator: {' and '.join(missing)} on PATH; install them, then run "
        "`make install`. Until then CPU peak memory is read from the process's RSS high-water mark, "
        "and each row says so in peak_mem_method"
    )


def load_or_build(lock_wait_s: float = LOCK_WAIT_S, build_timeout_s: float = BUILD_TIMEOUT_S) -> ModuleType:
    """The built module, compiled first if this folder has no complete build (ToolchainMissing where that
    cannot be done here, BuildError where it failed)."""
    folder = build_dir()
    if not (folder / COMPLETE).exists():
        problem = missing_tools()
        if problem:
            raise ToolchainMissing(problem)
        with BuildLock(folder.with_name(folder.name + ".lock"), lock_wait_s) as lock:
            if not (folder / COMPLETE).exists():  # another process may have built it while this one waited
                _compile(folder, build_timeout_s, lock)
    return _import(folder)


def _compile(folder: Path, timeout_s: float, lock: BuildLock) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    # torch's own lock file, left by a build killed mid-way: this process holds the BuildLock, so no build of
    # this folder is running, and torch's loader would otherwise wait on it for ever
    (folder / "lock").unlink(missing_ok=True)
    log = folder / "build.log"
    child_args = ["--compile", str(folder), "--parent", str(os.getpid())]
    command = [sys.executable, "-m", "collect.measure.cpu_alloc", *child_args]
    with open(log, "wb") as out:
        # its own session, so a time-out stops ninja and the compiler too, not only the child; the lock's
        # descriptor goes with it, so the lock stays held while the child lives, even if this process is killed
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "PATH": _tool_path()}, pass_fds=(lock.fd,))  # fmt: skip
        try:
            code = child.wait(timeout=timeout_s)
        except BaseException as exc:  # the time limit, or this process interrupted: leave no build behind
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise BuildError(f"building the CPU counting allocator ran past {timeout_s:.0f} s and was stopped; "
                                 f"its output: {log}") from None  # fmt: skip
            raise
    if code != 0:
        raise BuildError(f"building the CPU counting allocator failed (exit {code}): {_first_error(log)}; see {log}")
    (folder / COMPLETE).write_text(f"{SOURCE.name} built for torch {torch.__version__}\n")


def _first_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[0][:300]


def _import(folder: Path) -> ModuleType:
    path = folder / f"{NAME}.so"
    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)  # torch is imported above: the libraries the module links to are loaded
    except ImportError as exc:
        raise BuildError(f"cannot load {path}: {exc}; delete {folder} to build it again") from None
    return module


@functools.cache
def _extension() -> ModuleType | None:
    """The module, or None where this machine cannot build it (the one line saying why is printed once)."""
    try:
        return load_or_build()
    except ToolchainMissing as exc:
        print(f"note: {exc}", file=sys.stderr, flush=True)
        return None


def build() -> bool:
    """Build the extension if it is missing (the parent does this before spawning ranks, so they only load it);
    False where it cannot be built here."""
    return _extension() is not None


@functools.cache
def install() -> bool:
    """Make the counting allocator torch's CPU allocator in this process (idempotent); False where it cannot
    be built here, and CPU peaks must be read another way."""
    module = _extension()
    if module is not None:
        module.install()
    return module is not None


def live_bytes() -> int:
    return _extension().live_bytes()


def peak_bytes() -> int:
    return _extension().peak_bytes()


def reset_peak() -> None:
    """Start a new high-water mark at the bytes live now."""
    _extension().reset_peak()


def _compile_here(folder: Path, parent: int | None) -> None:
    if parent is not None:
        _die_with(parent)
    # lazy: only the build's child process runs torch's extension builder (and needs ninja and the compiler)
    from torch.utils.cpp_extension import load

    load(NAME, [str(SOURCE)], extra_cflags=CFLAGS, build_directory=str(folder), verbose=True)


def _die_with(parent: int) -> None:
    """In the build's child, a session of its own: once ``parent`` is gone (killed by any signal, SIGKILL too,
    when nothing of it can clean up), kill this whole session, ninja and the compiler with it. Its parent is read
    from the process table, not trusted to be alive at start: a parent killed before the child got here is gone
    already."""

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collect.measure.cpu_alloc", description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="store_true", help="build the allocator now if it is missing")
    parser.add_argument("--compile", metavar="DIR", help=argparse.SUPPRESS)  # the build's child process
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # ... and the process it dies with
    args = parser.parse_args(argv)
    if not (args.build or args.compile):
        parser.error("nothing to do: pass --build")
    if args.compile:
        _compile_here(Path(args.compile), args.parent)
        return 0
    try:
        load_or_build()
    except ToolchainMissing as exc:
        print(f"note: {exc}", file=sys.stderr)
        return 0  # the collector runs without it, by the stated fallback
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"CPU counting allocator: {build_dir() / NAME}.so")
    return 0


if __name__ == "__main__":
    sys.exit(main())
