"""A one-host SLURM cluster the engine tests start for themselves: munged, slurmctld and slurmd, with every
config, key, state, log, pid and socket file in one temporary folder and the daemons on free ports.

The host is the only node, in a partition ``cpu``. No cgroups (proctrack/linuxproc, task/none), no slurmdbd:
finished jobs are written by jobcomp/filetxt, which is what ``sacct --completion`` reads. The daemons run as
root (slurmd must, to start jobs), so the tests that use it run as root, as CI does. Client commands get the
cluster through ``SLURM_CONF`` in the environment this class passes them; /etc/slurm and /etc/munge are
never read or written.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.engines.services import free_port

INSTALL = "apt-get install slurm-wlm munge"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sacct", "scancel", "scontrol", "sinfo", "squeue", "srun")
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE"}
COMMAND_S = 30  # one client command's own limit


def _binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def slurm_missing() -> str | None:
    """Why a SLURM cluster cannot be started here, in one line naming what to install; None if it can."""
    for name in (*DAEMONS, *CLIENTS):
        if _binary(name) is None:
            return f"no {name} ({INSTALL})"
    if os.geteuid() != 0:
        return "not root: slurmd must run as root to start jobs (run the engine tests as root, as CI does)"
    return None


def _hardware_line(node: str) -> str:
    """This host as slurmd sees it (CPUs, sockets, cores, threads, memory): a node configured otherwise drains."""
    out = subprocess.run([_binary("slurmd"), "-C"], capture_output=True, text=True, timeout=COMMAND_S, check=True)
    fields = [f for f in out.stdout.splitlines()[0].split() if not f.startswith("NodeName=")]
    return f"NodeName={node} NodeAddr=127.0.0.1 {' '.join(fields)} State=UNKNOWN"


class SlurmCluster:
    """``SlurmCluster().start()``; ``sbatch(...)`` gives a job id, ``wait(job, deadline_s)`` its final state,
    ``sacct(job)`` what jobcomp recorded, ``scancel(job)``; ``stop()`` ends what ``start()`` started."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="plansight-slurm-"))
        self.node = socket.gethostname().split(".")[0]  # what `hostname -s` prints: slurmd finds itself by it
        self.conf = self.folder / "slurm.conf"
        self.munge_socket = self.folder / "munge.socket"
        self.jobcomp = self.folder / "jobcomp.txt"
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        self.env["SLURM_CONF"] = str(self.conf)

    def _write_config(self) -> None:
        f = self.folder
        key = f / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        (f / "plugstack.conf").write_text("")  # not /etc/slurm's
        for sub in ("state", "spool"):
            (f / sub).mkdir()
        self.conf.write_text(
            f"""\
ClusterName=plansight
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={f / "state"}
SlurmdSpoolDir={f / "spool"}
SlurmctldPidFile={f / "slurmctld.pid"}
SlurmdPidFile={f / "slurmd.pid"}
SlurmctldLogFile={f / "slurmctld.log"}
SlurmdLogFile={f / "slurmd.log"}
PlugStackConfig={f / "plugstack.conf"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=5
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
{_hardware_line(self.node)}
PartitionName=cpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _spawn(self, name: str, *args: str) -> None:
        with open(self.folder / f"{name}.out", "w") as log:
            # its own session: the daemons (and the jobs slurmd starts, which inherit SLURM_CONF) are found
            # by their pids and that environment, never by name
            self.processes[name] = subprocess.Popen(
                [_binary(name), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
            )  # fmt: skip

    def _until(self, what: str, ready, deadline_s: float, every_s: float = 0.5):
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode} waiting for {what}: {self.logs()}")
            value = ready()
            if value:
                return value
            time.sleep(every_s)
        raise TimeoutError(f"{what}: not within {deadline_s:.0f} s; {self.logs()}")

    def start(self, deadline_s: float = 60) -> SlurmCluster:
        self._write_config()
        f = self.folder
        try:
            # --force: munged refuses a socket in a folder others cannot enter (mkdtemp's 0700); every client
            # here runs as root
            self._spawn("munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={f / 'munge.key'}",
                        f"--pid-file={f / 'munged.pid'}", f"--log-file={f / 'munged.log'}",
                        f"--seed-file={f / 'munged.seed'}")  # fmt: skip
            self._until("munged's socket", self.munge_socket.exists, deadline_s)
            self._spawn("slurmctld", "-D", "-f", str(self.conf))
            self._until("slurmctld", lambda: "is UP" in self.client("scontrol", "ping", check=False).stdout, deadline_s)
            self._spawn("slurmd", "-D", "-f", str(self.conf))
            self._until(f"node {self.node} idle", lambda: self.node_state().startswith("IDLE"), deadline_s)
        except BaseException:
            self.stop()
            raise
        return self

    def client(
        self, *cmd: str, check: bool = True, cwd: str | Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [_binary(cmd[0]), *cmd[1:]], capture_output=True, text=True, env={**self.env, **(env or {})}, cwd=cwd,
            timeout=COMMAND_S,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {result.returncode}: {result.stderr.strip()}")
        return result

    def node_state(self) -> str:
        out = self.client("scontrol", "show", "node", self.node, "--oneliner", check=False).stdout
        return next((f.split("=", 1)[1] for f in out.split() if f.startswith("State=")), "")

    def sbatch(
        self, script: str | Path, *args: str, options: tuple[str, ...] = (), cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> str:  # fmt: skip
        """Submit ``script args`` from ``cwd`` with sbatch ``options`` (which override the script's #SBATCH lines)
        and ``env`` added to the environment the job inherits; the job id."""
        out = self.client("sbatch", "--parsable", *options, str(script), *args, cwd=cwd, env=env).stdout
        return out.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        """The controller's state of a job it still knows (RUNNING, PENDING, COMPLETED, ...); '' once forgotten."""
        out = self.client("scontrol", "show", "job", job, "--oneliner", check=False).stdout
        return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")

    def sacct(self, job: str) -> dict[str, str]:
        """The job's record in the completion log (``sacct --completion``): JobID, State, ExitCode, ...; {} if none."""
        fields = "jobid,jobname,state,exitcode,nodelist,elapsed"
        out = self.client("sacct", "--completion", "-j", job, "-P", "-n", "-o", fields, check=False).stdout
        for line in out.splitlines():
            values = dict(zip(["JobID", "JobName", "State", "ExitCode", "NodeList", "Elapsed"], line.split("|")))
            if values["JobID"] == job:
                return values
        return {}

    def wait(self, job: str, deadline_s: float) -> dict[str, str]:
        """Block until the job has ended and jobcomp holds its record; that record."""
        return self._until(f"job {job} to end", lambda: self.sacct(job), deadline_s)

    def scancel(self, job: str) -> None:
        self.client("scancel", job)

    def logs(self) -> str:
        """The daemons' last log lines, and the output of any that exited (what it said before its log opened)."""
        exited = [f"{name}.out" for name, process in self.processes.items() if process.poll() is not None]
        tails = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", *exited):
            path = self.folder / name
            if path.exists():
                tails.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(tails)

    def _ours(self) -> list[int]:
        """Processes carrying this cluster's SLURM_CONF (slurmstepd and job steps, started by our slurmd)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if mark in (entry / "environ").read_bytes().split(b"\0"):
                        pids.append(int(entry.name))
                except OSError:  # gone meanwhile, or a kernel thread
                    continue
        return pids

    def stop(self, deadline_s: float = 60) -> None:
        """Cancel every job, end the daemons this object started, then any process of its jobs left; remove the
        folder. Nothing it started is left running."""
        slurmctld = self.processes.get("slurmctld")
        if slurmctld and slurmctld.poll() is None:
            jobs = self.client("squeue", "-h", "-o", "%i", check=False).stdout.split()
            for job in jobs:
                self.client("scancel", job, check=False)
            deadline = time.monotonic() + deadline_s
            while jobs and time.monotonic() < deadline:
                if not self.client("squeue", "-h", "-o", "%i", check=False).stdout.split():
                    break
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for pid in self._ours():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self._ours() and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(self.folder, ignore_errors=True)
