"""The counting allocator's build and load never hang and never need a toolchain at run time: a lock names its
holder and is free the moment that holder dies, a built allocator loads without ninja or a compiler, and without
a compiler one line says what to install and CPU peaks fall back to a labelled method."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from collect.launch.result import RankOutcome, build_row, combine_ranks
from collect.measure.build_lock import BuildError, BuildLock
from collect.measure.memory import CPU_FALLBACK_METHOD, PEAK_MEM_METHODS
from tests.conftest import tiny_spec

BUILD_TIMEOUT_S = 900  # a first build takes ~45 s on two busy cores; only a hang gets near this


def _hold(lock, tmp_path) -> subprocess.Popen:
    """A live process holding ``lock`` until killed."""
    ready = tmp_path / "ready"
    code = f"""
        import pathlib, time
        from collect.measure.build_lock import BuildLock
        with BuildLock(pathlib.Path({str(lock)!r}), wait_s=60):
            pathlib.Path({str(ready)!r}).touch()
            time.sleep(120)
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)])
    for _ in range(600):
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert ready.exists(), "the holder did not take the lock"
    return proc


def test_a_lock_held_by_a_live_process_times_out_naming_it(tmp_path):
    lock = tmp_path / "build.lock"
    holder = _hold(lock, tmp_path)
    try:
        with pytest.raises(BuildError, match=f"held by pid {holder.pid} on {socket.gethostname()} since"):
            with BuildLock(lock, wait_s=0.5):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_process_waiting_for_the_lock_says_what_it_waits_for(tmp_path, capsys):
    lock = tmp_path / "build.lock"
    holder = _hold(lock, tmp_path)
    try:
        with pytest.raises(BuildError):
            with BuildLock(lock, wait_s=1.0, report_s=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()
    said = capsys.readouterr().err.splitlines()
    assert 2 <= len(said) <= 4 and all(f"held by pid {holder.pid}" in line for line in said), said


def test_a_lock_left_by_a_killed_process_is_free_at_once(tmp_path):
    lock = tmp_path / "build.lock"
    holder = _hold(lock, tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert json.loads(lock.read_text())["pid"] == holder.pid  # the dead holder's name is still in the file
    assert "no longer running" in BuildLock(lock, wait_s=0).holder()
    with BuildLock(lock, wait_s=5):  # would raise after 5 s if the dead holder still held it
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def _env(extensions_dir, path: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env["TORCH_EXTENSIONS_DIR"] = str(extensions_dir)
    if path is not None:
        env["PATH"] = path
    return env


def _python(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _builders(folder: str) -> list[int]:
    """Processes building in ``folder``: the build's child (named by its command line), and ninja and the compiler
    (which run in the folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if "--compile" in cmdline and folder in cmdline or cwd == folder:
            found.append(int(entry))
    return found


def _kill_mid_build(env: dict, folder: str, kill) -> list[int]:
    """Start a build as `collect measure` would, in a session of its own, wait for its compiler, ``kill`` it; the
    builders still running 5 s later (none, unless the build's child outlives its parent)."""
    command = [sys.executable, "-m", "collect.measure.cpu_alloc", "--build"]
    measure = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not [p for p in _builders(folder) if p != measure.pid]:  # the compiler's cwd is the build folder
        assert measure.poll() is None and time.monotonic() < deadline, "the build never started its compiler"
        time.sleep(0.1)
    kill(measure)
    measure.wait()
    deadline = time.monotonic() + 5
    while _builders(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _builders(folder)


@pytest.fixture(scope="module")
def built_after_a_killed_build(tmp_path_factory):
    """A fresh extensions folder where two builds were killed mid-way, with their compilers running (SIGKILL to
    the first one's whole session, as a terminal closing does; SIGTERM to the second one alone), then `make
    install`'s build step run: (folder, what each kill left running, the build)."""
    root = tmp_path_factory.mktemp("extensions")
    env = _env(root)
    folder = _python("from collect.measure import cpu_alloc; print(cpu_alloc.build_dir())", env).stdout.strip()
    assert folder.startswith(str(root))
    left = [
        _kill_mid_build(env, folder, lambda proc: os.killpg(proc.pid, signal.SIGKILL)),
        _kill_mid_build(env, folder, lambda proc: proc.send_signal(signal.SIGTERM)),
    ]
    build = subprocess.run([sys.executable, "-m", "collect.measure.cpu_alloc", "--build"], env=env,
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)  # fmt: skip
    return root, left, build


def test_killing_a_build_kills_its_compiler_whatever_the_signal(built_after_a_killed_build):
    _, left, _ = built_after_a_killed_build
    assert left == [[], []]


def test_a_build_killed_mid_way_does_not_stop_the_next(built_after_a_killed_build):
    _, _, build = built_after_a_killed_build
    assert build.returncode == 0, build.stderr
    assert "CPU counting allocator:" in build.stdout and "Traceback" not in build.stderr


def test_a_built_allocator_loads_without_ninja_or_a_compiler(built_after_a_killed_build, tmp_path):
    root, _, build = built_after_a_killed_build
    assert build.returncode == 0, build.stderr
    code = """
        import torch
        from collect.measure import cpu_alloc
        assert cpu_alloc.install()
        cpu_alloc.reset_peak()
        base = cpu_alloc.live_bytes()
        x = torch.empty(2**20, dtype=torch.uint8)
        print(cpu_alloc.peak_bytes() - base)
    """
    proc = _python(code, _env(root, path=str(tmp_path)))  # an empty folder: no ninja, no c++
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert int(proc.stdout) == 2**20


def test_without_a_compiler_one_line_says_what_to_install_and_peaks_fall_back(tmp_path):
    code = """
        import json, torch
        from collect.measure import cpu_alloc
        from collect.measure.memory import PeakMemory
        assert not cpu_alloc.build()
        with PeakMemory(torch.device("cpu")) as mem:
            x = torch.ones(2**24)  # 64 MiB, written: resident
        print(json.dumps({"method": mem.method, "peak": mem.peak_bytes}))
    """
    (tmp_path / "bin").mkdir()
    proc = _python(code, _env(tmp_path / "extensions", path=str(tmp_path / "bin")))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: cannot build the CPU counting allocator"), proc.stderr
    # the venv's pinned ninja is found off PATH, so only the compiler is missing
    assert "apt-get install g++" in lines[0] and "pip install ninja" not in lines[0]
    out = json.loads(proc.stdout)
    assert out["method"] == CPU_FALLBACK_METHOD != PEAK_MEM_METHODS["cpu"]
    assert out["peak"] >= 2**26


def test_a_row_carries_its_ranks_method_and_ranks_that_differ_are_not_combined():
    spec = tiny_spec(dp=2)
    fallback = RankOutcome(ok=True, times=[0.1], peak_mem_bytes=5, peak_mem_method=CPU_FALLBACK_METHOD)
    counted = RankOutcome(ok=True, times=[0.1], peak_mem_bytes=4, peak_mem_method=PEAK_MEM_METHODS["cpu"])
    result = combine_ranks(spec, {0: fallback, 1: fallback}, 2, 60.0, 1.0)
    assert build_row(spec, result)["peak_mem_method"] == CPU_FALLBACK_METHOD
    mixed = combine_ranks(spec, {0: fallback, 1: counted}, 2, 60.0, 1.0)
    assert mixed.status == "error" and "different methods" in mixed.error
