"""The Slurm backend: Loom decides, Slurm launches and accounts (`loom serve --backend slurm`).

Inventory: nodes, GPUs (gres) and states from `scontrol show nodes`, the switch tree from
`scontrol show topology` (the topology.conf importer's rules; a cluster without a tree is
one leaf). A node Slurm marks down, drained or back in service is reported as such
(NodeDown / NodeDrained / NodeUp), from a watcher polling every `node_poll_s`.

Jobs: each start runs the job's command (`loom run …`, or the built-in sleep job) as a
batch job on exactly the nodes Loom chose, with exactly the GPUs per node it chose:

    sbatch --hold --job-name loom.JOB --nodes K --nodelist A,B --gres gpu:G --time T … SCRIPT

Nodes that get different GPU counts become components of one heterogeneous job (one per
count, the job's first node in the first component, where the batch script runs). The
job is submitted *held*, its Slurm id recorded in the run record, then released: a
service killed between the two leaves a held job that the next one releases (its record
says Loom started it) or cancels (no record: the launch never counted), so a job is never
started twice. `--nodelist` at submission rather than `scontrol update ReqNodeList=` after
it: one command, and Slurm never sees the job without its nodes. Every job has a time
limit (`time_limit_s`, or `time_factor` × its stated duration, at least a minute).

Everything else is the local backend's (`local.py`, `watch.py`): the job's files under the
backend's root (a file system the nodes share), preempt / migrate / resize through the
runtime's control channel, the exit status (here Slurm's `ExitCode=` and end state, through
`SlurmJob`), the log's tail and the diagnosis of a failure, adoption after a restart.
Multi-node jobs run their command on the first node; `loom run` then starts every
process there (a launcher that spans the nodes with `srun` is future work).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any

from loom.errors import LoomInputError
from loom.hardware.importers._common import resolve_gpu_type
from loom.hardware.importers.slurm import expand_hostlist, tree_topology
from loom.hardware.topology import Topology
from loom.service.backends import runs as R
from loom.service.backends.local import LocalBackend
from loom.service.backends.slurmcli import QueueView, SlurmCLI, SlurmError, SlurmJob, gpu_gres, time_limit

log = logging.getLogger("loom.service.slurm")
DEFAULT_TIME_LIMIT_S = 7 * 24 * 3600.0


def slurm_topology(cli: SlurmCLI, gpu_type: str | None = None, name: str = "slurm") -> Topology:
    """The cluster as Slurm describes it: gres GPUs per node, the topology/tree switches."""
    try:
        nodes = cli.nodes()
    except SlurmError as exc:
        raise LoomInputError(f"cannot read the Slurm cluster's nodes: {exc}", source="slurm", field="backend") from None
    gres = {n["NodeName"]: gpu_gres(n.get("Gres", "")) for n in nodes if "NodeName" in n}
    if not gres:
        raise LoomInputError("Slurm reports no nodes (`scontrol show nodes` is empty)", source="slurm")

    def gpus_of(host: str) -> tuple[str, int]:
        kind, count = gres.get(host, (None, 0))
        if gpu_type is not None:
            return resolve_gpu_type(gpu_type, source="slurm", field="gpu_type"), count
        if kind is None:
            raise LoomInputError(f"node {host}'s GPUs have no type in its Gres= (e.g. gpu:a100:8): "
                                 "give the backend a gpu_type", source="slurm", field="gpu_type")
        return resolve_gpu_type(kind, source=f"slurm node {host}", field="gpu_type"), count

    text = _tree_only(cli.topology()) or f"SwitchName=slurm Nodes={','.join(gres)}"
    return tree_topology(text, source="scontrol show topology", gpus_of=gpus_of, name=name,
                         description="Slurm cluster (scontrol show nodes / topology)")


def _tree_only(text: str) -> str:
    """`scontrol show topology` lists, on a parent switch, every node below it too: keep Switches= only."""
    lines = []
    for line in text.splitlines():
        tokens = line.split()
        if any(t.startswith("Switches=") for t in tokens):
            tokens = [t for t in tokens if not t.startswith("Nodes=")]
        lines.append(" ".join(tokens))
    return "\n".join(lines)


def node_condition(state: str) -> str:
    """`IDLE`, `MIXED`, `DOWN*`, `IDLE+DRAIN`, `DRAINED`, … → up | down | drained. A node that is
    only not responding (`IDLE*`) is not down yet: Slurm marks it DOWN after SlurmdTimeout."""
    flags = state.upper()
    if "DOWN" in flags or "FAIL" in flags.replace("FAILING", ""):
        return "down"
    if "DRAIN" in flags:
        return "drained"
    return "up"


class SlurmBackend(LocalBackend):
    name = "slurm"

    def __init__(self, cli: SlurmCLI, *, root: str | Path, gpu_type: str | None = None, partition: str | None = None,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S, time_factor: float | None = None,
                 node_poll_s: float = 1.0, launch_delay: Any = 0.0, **local: Any) -> None:
        self.cli = cli
        self.queue = QueueView(cli)
        self.partition, self.time_limit_s, self.time_factor = partition, time_limit_s, time_factor
        self.node_poll_s = node_poll_s
        # launch_delay: an extra emulated delay before submission (the conformance suite's launch model)
        super().__init__(slurm_topology(cli, gpu_type), root=root, launch_delay=launch_delay, **local)
        (self.layout.root / "slurm").mkdir(parents=True, exist_ok=True)
        self.held = self._settle_held()
        self._conditions: dict[str, str] = {}
        self._cond_lock = threading.Lock()
        self._cond_version = 0  # bumped by fail_node/repair_node: a read that straddles one is dropped
        self._node_thread: threading.Thread | None = None

    @classmethod
    def from_environment(cls, **kwargs: Any) -> SlurmBackend:
        """The Slurm commands on this host (`LOOM_SLURM_PREFIX` prepends e.g. an nsenter command)."""
        prefix = tuple(shlex.split(os.environ.get("LOOM_SLURM_PREFIX", "")))
        return cls(SlurmCLI(prefix), **kwargs)

    def bind(self, sink: Any) -> None:
        super().bind(sink)
        if self._node_thread is None and self.node_poll_s > 0:
            self._conditions = self._read_conditions()
            self._node_thread = threading.Thread(target=self._watch_nodes, name="loom-slurm-nodes", daemon=True)
            self._node_thread.start()

    # ------------------------------------------------------------------ launching
    def _start_proc(self, run: R.Run, argv: list[str], workdir: Path, env: dict[str, str]) -> SlurmJob:
        script = self.layout.root / "slurm" / f"{run.job_id}.sh"
        script.write_text("#!/bin/sh\n# written by Loom's Slurm backend: the job's command, on its first node\n"
                          f"exec {shlex.join(argv)}\n")
        self._started_log(run.job_id)
        out = self.cli.run(["sbatch", *self.sbatch_args(run, workdir), str(script)], env=env)
        try:
            slurm_id = int(out.strip().split(";")[0])
        except ValueError:
            raise OSError(f"sbatch said {out.strip()!r}, not a job id") from None
        return SlurmJob(slurm_id, self.cli, self.queue)

    def sbatch_args(self, run: R.Run, workdir: Path) -> list[str]:
        """Held, named, time-limited, on exactly its nodes with exactly its GPUs per node."""
        assert run.binding is not None
        first = run.allocation.nodes[0] if run.allocation.nodes else min(run.binding)
        counts: dict[int, list[int]] = {}
        for node in sorted(run.binding, key=lambda n: (n != first, n)):
            counts.setdefault(len(run.binding[node]), []).append(node)
        common = ["--job-name", f"loom.{run.job_id}", "--time", time_limit(self._limit(run)),
                  *(["--partition", self.partition] if self.partition else [])]
        args = ["--parsable", "--hold", "--output", str(self.layout.log(run.job_id)), "--open-mode", "append",
                "--chdir", str(workdir)]
        for k, (gpus, nodes) in enumerate(counts.items()):
            if k:
                args.append(":")
            names = ",".join(self.topology.node_names[n] for n in nodes)
            args += [*common, "--nodes", str(len(nodes)), "--nodelist", names, "--ntasks-per-node", "1",
                     *(["--gres", f"gpu:{gpus}"] if gpus else [])]
        return args

    def _limit(self, run: R.Run) -> float:
        stated = R.duration(run) if run.sleep or run.spec.duration else 0.0
        if self.time_factor and stated > 0:
            return max(60.0, self.time_factor * stated)
        return self.time_limit_s

    def _spawn(self, run: R.Run, now: float) -> None:
        super()._spawn(run, now)  # submitted held, run record written
        if isinstance(run.proc, SlurmJob) and self._runs.get(run.job_id) is run:
            try:
                run.proc.release()
            except SlurmError as exc:
                log.error("job %s: cannot release Slurm job %s: %s", run.job_id, run.proc.slurm_id, exc)
                run.phase, run.after_exit = "dying", []
                run.proc.kill()

    # ------------------------------------------------------------------ after a restart
    def _revivable(self, data: dict[str, Any]) -> bool:
        return isinstance(data.get("slurm_id"), int)

    def _revive(self, data: dict[str, Any], job_id: str) -> SlurmJob:
        return SlurmJob(int(data["slurm_id"]), self.cli, self.queue)

    def _settle_held(self) -> dict[str, list[int]]:
        """Held jobs a killed service left: released when a run record says Loom started them,
        cancelled otherwise (the launch never counted; the job will be started anew)."""
        recorded = {}
        for path in sorted(self.layout.record("x").parent.glob("*.json")):
            data = R.read_json(path) or {}
            if isinstance(data.get("slurm_id"), int):
                recorded[int(data["slurm_id"])] = str(data.get("job_id"))
        done: dict[str, list[int]] = {"released": [], "cancelled": []}
        for slurm_id, (state, reason) in self.cli.queue().items():
            if state != "PENDING" or "Held" not in reason:
                continue
            if slurm_id in recorded:
                self.cli.run(["scontrol", "release", str(slurm_id)], check=False)
                done["released"].append(slurm_id)
            else:
                self.cli.run(["scancel", str(slurm_id)], check=False)
                done["cancelled"].append(slurm_id)
        if done["released"] or done["cancelled"]:
            log.warning("Slurm jobs left held by a previous service: released %s, cancelled %s",
                        done["released"], done["cancelled"])
        return done

    # ------------------------------------------------------------------ node states
    def _read_conditions(self) -> dict[str, str]:
        known = set(self.topology.node_names)
        return {n["NodeName"]: node_condition(n.get("State", "")) + "|" + n.get("Reason", "")
                for n in self.cli.nodes() if n.get("NodeName") in known}

    def _watch_nodes(self) -> None:
        while not self._closed:
            time.sleep(self.node_poll_s)
            version = self._cond_version
            try:
                now = self._read_conditions()
            except SlurmError as exc:
                log.warning("cannot read Slurm's node states: %s", exc)
                continue
            with self._cond_lock:
                if version != self._cond_version:
                    continue
                changed = [(name, self._conditions.get(name, "up|").split("|")[0], seen) for name, seen in now.items()
                           if seen.split("|")[0] != self._conditions.get(name, "up|").split("|")[0]]
                self._conditions = now
            for name, before, seen in changed:
                self._node_changed(name, before, *seen.split("|", 1))

    def _node_changed(self, name: str, before: str, after: str, reason: str) -> None:
        why = f"Slurm: node {name} is {after}" + (f" ({reason})" if reason else "")
        log.info("%s (was %s)", why, before)
        if before == "down":
            LocalBackend.repair_node(self, name)
        if after == "down":
            LocalBackend.fail_node(self, name, why)
        elif after == "drained":
            self.drain_node(name, why)
        elif before == "drained":
            self.undrain_node(name)

    def fail_node(self, name: str, cause: str = "emulated node failure") -> None:
        """Take a node down in Slurm (which ends its jobs) and report it at once."""
        self.cli.run(["scontrol", "update", f"nodename={name}", "state=down", f"reason={cause[:60]}"], check=False)
        with self._cond_lock:
            self._conditions[name], self._cond_version = "down|" + cause, self._cond_version + 1
        super().fail_node(name, cause)

    def repair_node(self, name: str) -> None:
        self.cli.run(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
        with self._cond_lock:
            self._conditions[name], self._cond_version = "up|", self._cond_version + 1
        super().repair_node(name)

    def close(self, *, kill: bool = True) -> None:
        super().close(kill=kill)
        if self._node_thread is not None and self._node_thread is not threading.current_thread():
            self._node_thread.join(timeout=self.node_poll_s + 5)


def job_nodes(cli: SlurmCLI, slurm_id: int) -> dict[str, int]:
    """Where Slurm ran a job: node → GPUs over every component (`scontrol -o -d show job`'s
    ` Nodes=n[0-1] CPU_IDs=… Mem=… GRES=gpu:2(IDX:0-1)` pieces)."""
    out = cli.run(["scontrol", "-o", "-d", "show", "job", str(slurm_id)], check=False)
    found: dict[str, int] = {}
    for m in re.finditer(r"\bNodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)", out):
        for host in expand_hostlist(m.group(1)):
            found[host] = found.get(host, 0) + gpu_gres(m.group(2))[1]
    return found
