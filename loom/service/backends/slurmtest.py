"""A real, throwaway Slurm cluster for the tests (Debian's slurmctld/slurmd/slurm-client and
munge, which scripts/setup.sh installs): no mock scheduler, and no Loom logic here.

`SlurmCluster` is a context manager.  On entry, in a fresh temporary directory, it

- creates a loopback-only network namespace `loom-slurm-<random>` (`ip netns add`), brings
  `lo` up and gives it a second address 127.0.0.2/8 (getaddrinfo needs it).  slurmctld and
  slurmd bind all interfaces on fixed ports, so every daemon runs inside the namespace, entered
  with `nsenter --net=/var/run/netns/<name>` (not `ip netns exec`, which remounts /sys);
- writes a munge key (root-owned, 0400) and starts munged as root (`--force`) with its socket,
  pid, log and seed files in the temporary directory; Slurm finds the socket through
  `AuthInfo=socket=...` in slurm.conf;
- makes fake GPUs: 8 character devices (major 195, as nvidia's) per node with `mknod`, named by
  `File=` in gres.conf;
- writes slurm.conf (16 nodes n0..n15 with 8 GPUs each, select/cons_tres, topology/tree,
  proctrack/linuxproc, task/none, one partition `all`), gres.conf and a three-level
  topology.conf (4 leaf switches of 4 nodes, 2 spines, 1 core);
- starts slurmctld and one `slurmd -N <node>` per node, each on its own port, and waits until
  `sinfo` shows every node idle.

Several slurmd's on one host: Debian 12's Slurm 22.05.8 is built with multiple-slurmd support
(`scontrol show config` reports MULTIPLE_SLURMD = Yes), so all 16 nodes share NodeHostname=localhost
and NodeAddr=127.0.0.1; `slurmd -N <node>` tells each daemon which node it is, each node has
its own Port, and the spool dir, pid and log files are per node through `%n`.

`run(cmd)` runs a Slurm client command inside the namespace with SLURM_CONF set.  On exit every
process inside the namespace (munged, slurmctld, the slurmd's and any slurmstepd or job they
left) gets SIGTERM, then SIGKILL (each daemon runs under a small subreaper, REAPER, so even the
slurmstepd's slurmd double-forks are reaped rather than left as zombies of PID 1), the namespace is deleted and the directory removed.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

BINARIES = ("slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "scontrol", "munged", "ip", "nsenter", "mknod")
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
N_NODES = 16
GPUS_PER_NODE = 8
CPUS_PER_NODE = 16
MEMORY_MB = 64000
NODES_PER_LEAF = 4
SLURMCTLD_PORT = 6817
SLURMD_PORT0 = 6900  # node i listens on SLURMD_PORT0 + i (the namespace has its own ports)
START_TIMEOUT_S = 45.0


# Every daemon runs under this tiny reaper: it becomes a child subreaper (prctl
# PR_SET_CHILD_SUBREAPER), runs the daemon as its child, forwards SIGTERM/SIGINT to it and reaps
# whatever is orphaned below it (slurmd double-forks slurmstepd, which would otherwise end as a
# zombie of PID 1).  When the daemon exits it stops and reaps what the daemon left, then exits
# with the daemon's status, so nothing outlives the daemon, not even a zombie.
REAPER = r"""
import ctypes, os, signal, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
pid, pending = None, []
def fwd(sig, frame):
    if pid is None:
        pending.append(sig)
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
signal.signal(signal.SIGTERM, fwd)
signal.signal(signal.SIGINT, fwd)
ready = int(sys.argv.pop(1))
pid = os.fork()
if pid == 0:
    os.close(ready)
    os.execv(sys.argv[1], sys.argv[1:])
os.write(ready, b"1")  # handlers in place and the daemon forked: safe to signal us now
os.close(ready)
for sig in pending:
    fwd(sig, None)
code = 1
while True:
    try:
        p, st = os.wait()
    except ChildProcessError:
        break
    if p == pid:
        code = os.waitstatus_to_exitcode(st)
        break
def children():
    me, out = str(os.getpid()), []
    for e in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % e) as f:
                if e.isdigit() and f.read().rsplit(")", 1)[1].split()[1] == me:
                    out.append(int(e))
        except (OSError, IndexError):
            pass
    return out
for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
    for c in children():
        try:
            os.kill(c, sig)
        except ProcessLookupError:
            pass
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.02)
        except ChildProcessError:
            break
sys.exit(code if code >= 0 else 128 - code)
"""


def which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN_DIRS:
        p = Path(d, name)
        if p.exists() and os.access(p, os.X_OK):
            return str(p)
    return None


def missing_requirements() -> str | None:
    """Why a SlurmCluster cannot start here (not root, binaries missing), or None."""
    if os.geteuid() != 0:
        return "SlurmCluster needs root (network namespaces, munged, slurmd)"
    missing = [b for b in BINARIES if which(b) is None]
    if missing:
        return f"Slurm/munge binaries missing: {', '.join(missing)} (run ./scripts/setup.sh)"
    return None


class SlurmCluster:
    def __init__(self, n_nodes: int = N_NODES, gpus_per_node: int = GPUS_PER_NODE,
                 start_timeout_s: float = START_TIMEOUT_S, prefix: str = "n") -> None:
        self.per_leaf = min(NODES_PER_LEAF, n_nodes)
        if n_nodes < 1 or n_nodes % self.per_leaf:
            raise ValueError(f"n_nodes must be a multiple of {NODES_PER_LEAF} (or fewer)")
        self.n_nodes, self.gpus_per_node, self.prefix = n_nodes, gpus_per_node, prefix
        self.start_timeout_s = start_timeout_s
        self.nodes = [f"{prefix}{i}" for i in range(n_nodes)]
        self.netns = f"loom-slurm-{secrets.token_hex(4)}"
        self.root: Path | None = None
        self.conf: Path | None = None
        self.munge_socket: Path | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._ready: dict[str, int] = {}  # read end of each reaper's readiness pipe
        self._netns_made = False

    # ---- paths and env ---------------------------------------------------------------------

    @property
    def netns_path(self) -> str:
        return f"/var/run/netns/{self.netns}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["MUNGE_SOCKET"] = str(self.munge_socket)
        for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_", "SRUN_")) and k != "SLURM_CONF"]:
            del env[k]
        return env

    def _ns(self, cmd: Sequence[str]) -> list[str]:
        return [which("nsenter") or "nsenter", f"--net={self.netns_path}", "--", *cmd]

    def run(self, cmd: Sequence[str] | str, *, check: bool = False, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a Slurm client command (argv list, or a shell string) inside the namespace."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.run(self._ns(argv), env=self.env(), capture_output=True, text=True,
                              check=check, timeout=timeout, cwd=self.root)

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        why = missing_requirements()
        if why:
            raise RuntimeError(why)
        self.root = Path(tempfile.mkdtemp(prefix="loom-slurm-"))
        os.chmod(self.root, 0o755)
        try:
            self._make_netns()
            self._start_munge()
            self._write_config()
            self._start_slurm()
            self.wait_idle()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_netns(self) -> None:
        ip = which("ip")
        subprocess.run([ip, "netns", "add", self.netns], check=True, capture_output=True)
        self._netns_made = True
        subprocess.run([ip, "-n", self.netns, "link", "set", "lo", "up"], check=True, capture_output=True)
        subprocess.run([ip, "-n", self.netns, "addr", "add", "127.0.0.2/8", "dev", "lo"], check=True, capture_output=True)

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen:
        r, w = os.pipe()
        try:
            with open(self.root / "log" / f"{name}.out", "ab") as log:
                p = subprocess.Popen(self._ns([sys.executable, "-c", REAPER, str(w), *argv]), env=self.env(),
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, cwd=self.root, pass_fds=(w,))
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self._procs[name] = p
        self._ready[name] = r
        return p

    def _await_ready(self, name: str, timeout: float = 5.0) -> None:
        """Wait until the reaper of `name` has its signal handlers and has forked the daemon (or died)."""
        fd = self._ready.pop(name, None)
        if fd is None:
            return
        try:
            if select.select([fd], [], [], timeout)[0]:
                os.read(fd, 1)
        finally:
            os.close(fd)

    def _start_munge(self) -> None:
        mdir = self.root / "munge"
        mdir.mkdir(mode=0o700)
        (self.root / "log").mkdir()
        key = mdir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)  # munged wants the key owned by its own user (root here), not readable by others
        self.munge_socket = mdir / "munge.socket"
        self._spawn("munged", [which("munged"), "--foreground", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={mdir / 'munged.pid'}", f"--log-file={mdir / 'munged.log'}",
                               f"--seed-file={mdir / 'munged.seed'}", "--num-threads=4"])
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self._tail('munged.out')}")
            time.sleep(0.05)

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "dev", "jobs"):
            (r / d).mkdir()
        conf_lines = [
            "ClusterName=loomtest",
            "SlurmctldHost=localhost(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={SLURMCTLD_PORT}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'spool' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",  # memory is not consumable: a job never takes a whole node's memory
            "GresTypes=gpu",
            "TopologyPlugin=topology/tree",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            # schedule a released job at once (the default batches for 3 s) and heterogeneous jobs,
            # which only the backfill scheduler starts, every second (default 30 s)
            "SchedulerParameters=batch_sched_delay=0,bf_interval=1",
            "SlurmdParameters=config_overrides",  # trust the configured CPUs/memory, not this host's
            "ReturnToService=1",  # a node set DOWN stays down until resumed (2 would return it at its next ping)
            "MinJobAge=3600",  # finished jobs stay visible to `scontrol show job`
            "MailProg=/bin/true",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "KillWait=5",
            "MessageTimeout=10",
            "TreeWidth=65533",  # the controller talks to every slurmd itself, no forwarding tree
            "PrologFlags=",
        ]
        conf_lines = [l for l in conf_lines if not l.endswith("=")]
        gres_lines = ["AutoDetect=off"]
        for i, node in enumerate(self.nodes):
            conf_lines.append(
                f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={SLURMD_PORT0 + i} "
                f"CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB} Gres=gpu:{self.gpus_per_node} State=UNKNOWN")
            ddir = r / "dev" / node
            ddir.mkdir()
            for g in range(self.gpus_per_node):
                subprocess.run([which("mknod"), str(ddir / f"nvidia{g}"), "c", "195", str(i * self.gpus_per_node + g)],
                               check=True, capture_output=True)
            gres_lines.append(f"NodeName={node} Name=gpu File={ddir}/nvidia[0-{self.gpus_per_node - 1}]")
        px = self.prefix
        conf_lines.append(f"PartitionName=all Nodes={px}[0-{self.n_nodes - 1}] Default=YES MaxTime=INFINITE State=UP")
        leaves = self.n_nodes // self.per_leaf
        topo = []
        for s in range(leaves):
            lo = s * self.per_leaf
            topo.append(f"SwitchName=leaf{s} Nodes={px}[{lo}-{lo + self.per_leaf - 1}]")
        spines = max(1, leaves // 2)
        per_spine = leaves // spines
        for s in range(spines):
            lo = s * per_spine
            hi = leaves - 1 if s == spines - 1 else lo + per_spine - 1
            topo.append(f"SwitchName=spine{s} Switches=leaf[{lo}-{hi}]")
        topo.append(f"SwitchName=core Switches=spine[0-{spines - 1}]")
        self.conf = r / "slurm.conf"
        self.conf.write_text("\n".join(conf_lines) + "\n")
        (r / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        (r / "topology.conf").write_text("\n".join(topo) + "\n")
        (r / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")

    def _start_slurm(self) -> None:
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            (self.root / "spool" / node).mkdir()
            self._spawn(f"slurmd-{node}", [which("slurmd"), "-D", "-N", node, "-f", str(self.conf)])

    def _tail(self, name: str, n: int = 30) -> str:
        p = self.root / "log" / name
        try:
            return f"--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-n:]) + "\n"
        except OSError:
            return ""

    def wait_idle(self) -> None:
        """Wait until sinfo shows every node idle (raises with the daemons' logs otherwise)."""
        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while True:
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{self._tail(name + '.out')}"
                                       f"{self._tail('slurmctld.log')}{self._tail(name + '.log')}")
            res = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
            last = res.stdout + res.stderr
            states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
            if res.returncode == 0 and len(states) == self.n_nodes and all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not idle after {self.start_timeout_s:.0f}s; sinfo:\n{last}\n"
                                   f"{self._tail('slurmctld.log')}{self._tail('slurmd-n0.log')}")
            time.sleep(0.25)

    def ns_pids(self) -> list[int]:
        """Every process whose network namespace is this cluster's (daemons, slurmstepd, jobs)."""
        try:
            target = os.stat(self.netns_path).st_ino
        except OSError:
            return []
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == target:
                    pids.append(int(entry))
            except OSError:
                pass
        return [p for p in pids if p != os.getpid()]

    def close(self) -> None:
        # Daemons first (gracefully: slurmctld saves state, slurmd stops its steps), then anything left
        # in the namespace, then the namespace and the directory.
        order = [n for n in self._procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            self._await_ready(name)  # a reaper signalled before its handlers exist would orphan its daemon
            p = self._procs.get(name)
            if p is not None and p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        reapers = {p.pid for p in self._procs.values()}
        for grace in (5.0, 5.0):
            deadline = time.monotonic() + grace
            for p in self._procs.values():
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            if all(p.poll() is not None for p in self._procs.values()):
                break
            # A daemon ignoring SIGTERM: SIGKILL it (not its reaper, which must stay to reap it).
            for pid in self.ns_pids():
                if pid not in reapers:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for p in self._procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.ns_pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + 3
            while pids and time.monotonic() < end:
                pids = [p for p in pids if _alive(p)]
                time.sleep(0.05)
        self._procs.clear()
        if self._netns_made:
            subprocess.run([which("ip") or "ip", "netns", "delete", self.netns], capture_output=True, check=False)
            self._netns_made = False
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
