"""A lock on a build folder that names its holder, says what a waiting process waits for, and is free the moment its
holder dies (collect.measure.cpu_alloc builds the counting allocator under it)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

WAIT_REPORT_S = 30.0  # a process waiting for the lock says so this often


class BuildError(RuntimeError):
    """The build failed, ran past its time limit, or another holder kept the lock too long (one line)."""


class BuildLock:
    """``with BuildLock(path, wait_s):`` an exclusive flock on ``path``, which holds its holder's pid, host and
    start time. The kernel releases a flock when its holder dies, however it dies, so a build killed mid-way
    leaves no lock to wait on (torch's own lock file stays behind for ever); a live holder is waited for at
    most ``wait_s``, then BuildError names it."""

    def __init__(self, path: Path, wait_s: float, poll_s: float = 0.2, report_s: float = WAIT_REPORT_S):
        self.path, self.wait_s, self.poll_s, self.report_s = Path(path), wait_s, poll_s, report_s
        self._fd: int | None = None

    @property
    def fd(self) -> int | None:
        """The locked descriptor while held: a child given it (pass_fds) holds the lock as long as it lives."""
        return self._fd

    def __enter__(self) -> "BuildLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        deadline, report = start + self.wait_s, start + self.report_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now >= report:  # a build takes half a minute or more: say what this process waits for
                    print(f"waiting for {self.path}, held by {self.holder()} ({now - start:.0f} s so far, "
                          f"giving up after {self.wait_s:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
                    report = now + self.report_s
                if now >= deadline:
                    os.close(fd)
                    raise BuildError(
                        f"{self.path} is held by {self.holder()}; gave up after {self.wait_s:.0f} s "
                        "(a build takes about 30 s: stop that process, or wait and run this again)"
                    ) from None
                time.sleep(self.poll_s)
            except OSError as exc:  # a file system without locks: building unguarded could corrupt a build
                os.close(fd)
                raise BuildError(
                    f"cannot lock {self.path}: {exc.strerror}; set TORCH_EXTENSIONS_DIR to a local folder"
                ) from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def holder(self) -> str:
        """Who holds the lock, in words: pid, host, since when (and whether that pid still runs, on this host)."""
        try:
            owner = json.loads(self.path.read_text())
            pid, host, since = int(owner["pid"]), str(owner["host"]), float(owner["since"])
        except (OSError, ValueError, KeyError, TypeError):
            return "a process that has not written its name yet"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
        state = ""
        if host == socket.gethostname() and not _running(pid):
            state = ", no longer running (a process it started may hold the lock)"
        return f"pid {pid} on {host} since {when} ({time.time() - since:.0f} s ago{state})"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
