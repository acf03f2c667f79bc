"""Services the engine tests start for themselves, each on a free loopback port or a socket in a temporary
folder, each stopped by what started it: a PostgreSQL cluster (initdb, pg_ctl) and an MLflow tracking server.

As root (CI) the database runs as the ``postgres`` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "plansight"
START_S = 60  # pg_ctl's own wait for the server to accept connections


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_missing() -> str | None:
    """Why a PostgreSQL cluster cannot be started here, in one line naming what to install; None if it can."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL server at {PG_BIN} (apt-get install postgresql-15, or set PG_BIN)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a `postgres` user to run the server as (apt-get install postgresql-15)"
    return None


class Postgres:
    """A throwaway PostgreSQL cluster: ``Postgres().start()``, ``.database(name)`` gives a URL, ``.stop()``."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="plansight-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def _run(self, *cmd: str, timeout: float = START_S + 30) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", "postgres", "--"] if self._owner else []
        return subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=timeout, check=True)

    def start(self) -> Postgres:
        if self._owner:
            os.chown(self.folder, self._owner.pw_uid, self._owner.pw_gid)
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", PG_USER, "--auth=trust", "-E", "UTF8")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.folder}"
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"),
                  "-w", "-t", str(START_S), "start")  # fmt: skip
        return self

    def database(self, name: str) -> str:
        """A new database on the cluster, as the URL optuna and MLflow take (SQLAlchemy's default driver for
        postgresql://, psycopg 3)."""
        self._run(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, name)
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


class MlflowServer:
    """``mlflow server`` on a free loopback port with ``backend`` as its store and a local artifact folder."""

    def __init__(self, backend: str, artifacts: Path):
        self.backend, self.artifacts, self.port = backend, artifacts, free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120) -> MlflowServer:
        mlflow = Path(sys.executable).parent / "mlflow"
        self.log = open(self.artifacts.parent / f"mlflow-server-{self.port}.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", self.backend, "--artifacts-destination",
             str(self.artifacts), "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PATH": f"{mlflow.parent}{os.pathsep}{os.environ.get('PATH', '')}"},
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.process.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"mlflow server did not answer on {self.url} within {timeout_s:.0f} s")

    def stop(self) -> None:
        """Its whole process group (the server's workers with it), and only that."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.log.close()
