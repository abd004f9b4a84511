"""`loom serve`, assembled: store, backend, engine (the unchanged core on a clock), the hooks that
persist what it does, the feeder that brings it what the API accepted, reconciliation after a
restart, and the web application.

Start-up order matters for crash safety: the store is opened (and migrated) first; the backend
reports what still runs; `reconcile` rebuilds the engine's view from both before the engine
thread or the API start, so nothing acknowledged is lost and nothing runs twice."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loom.errors import LoomInputError
from loom.service.dashboard import UtilisationSampler
from loom.service.feeder import StoreFeeder
from loom.service.reconcile import Reconciled, reconcile
from loom.service.recorder import StoreRecorder
from loom.service.service import Service

log = logging.getLogger("loom.service")
ADMIN_TOKEN_FILE = "admin.token"
LIVE_MAX_FAILURES = 5  # a job that keeps failing is not restarted a sixth time


@dataclass(frozen=True)
class ServeOptions:
    data_dir: Path
    db: str | None = None  # default: SQLite in data_dir
    backend: str = "local"
    inventory: Path | None = None  # the local backend's inventory file
    cluster: str | None = None  # for the sim backend: a cluster as `--cluster` takes it
    policy: str = "fcfs"
    placer: str = "best-fit"
    round_interval: float = 30.0
    host: str = "127.0.0.1"
    port: int = 8470
    max_body_bytes: int = 64 * 1024
    sample_s: float = 5.0
    recovery: bool = True  # the core's recovery pipeline (diagnose, localise, cordon, restart)
    spares_per_minipod: int = 0  # hot spare nodes kept for recoveries
    backend_options: dict[str, Any] = field(default_factory=dict)

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{(self.data_dir / 'loom.db').resolve()}"


class Runner:
    """Everything `loom serve` runs, built and started in order; `stop` stops it in reverse."""

    def __init__(self, options: ServeOptions) -> None:
        from loom.service.engine import LiveEngine
        from loom.service.store import Store

        self.options = options
        options.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = Store.open(options.db_url)
        try:
            self.admin_token_path = bootstrap_admin(self.store, options.data_dir)
            self.backend = build_backend(options)
            topology = self.backend.inventory().topology
            self.topology = topology
            _save_inventory(self.store, self.backend)
            self.service = Service(self.store, info={"backend": options.backend, "policy": options.policy,
                                                      "placer": options.placer})
            self.recorder = StoreRecorder(self.store, self.service.metrics, list(topology.node_names))
            self.engine = LiveEngine(self.backend, options.policy, options.placer,
                                     round_interval=options.round_interval, recovery=live_recovery(options),
                                     **self.recorder.hooks())
            self.recorder.engine = self.engine
            self.recorder.on_stored_ends = getattr(self.backend, "forget_ended", None)
        except BaseException:
            self.store.close()
            raise
        self.service.engine = self.engine
        self.service.backend = self.backend
        self.service.topology = topology
        self.feeder = StoreFeeder(self.store, self.engine)
        self.service.feeder = self.feeder
        self.sampler = UtilisationSampler(self.store, interval=options.sample_s)
        self.service.sampler = self.sampler
        self.reconciled: Reconciled | None = None

    def start(self) -> None:
        self.reconciled = reconcile(self.store, self.engine, self.backend, time.time())
        log.info(self.reconciled.line())
        self.engine.start()
        self.feeder.start()
        self.sampler.start()

    def stop(self, *, kill_jobs: bool = False) -> None:
        """Stop feeding and scheduling; jobs keep running unless `kill_jobs` (a restart adopts them)."""
        self.sampler.stop()
        self.feeder.stop()
        try:
            self.engine.stop()
        finally:
            close = getattr(self.backend, "close", None)
            if close is not None:
                close(kill=kill_jobs)
            self.store.close()

    def app(self) -> Any:
        from loom.service.api import create_app

        return create_app(self.service, max_body_bytes=self.options.max_body_bytes)


def live_recovery(options: ServeOptions) -> Any:
    """The core's recovery pipeline for a live backend: no priced delays (the simulator's model of
    detection, diagnosis and localisation); the steps take the time they really take."""
    if not options.recovery:
        return None
    from loom.core.recovery import RecoveryConfig

    return RecoveryConfig(detection_s=0.0, diagnosis_s=0.0, localisation_round_s=0.0,
                          spares_per_minipod=options.spares_per_minipod, max_failures=LIVE_MAX_FAILURES)


def bootstrap_admin(store: Any, data_dir: Path) -> Path:
    """On a fresh store: an `admin` tenant whose token goes to DATA_DIR/admin.token (mode 0600),
    the one way to make the first tenants (`loom tenant NAME` with it)."""
    path = data_dir / ADMIN_TOKEN_FILE
    if not store.tenants():
        _, token = store.create_tenant("admin", admin=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    return path


def build_backend(options: ServeOptions) -> Any:
    from loom.service.backends import backend_class

    cls = backend_class(options.backend)
    if options.backend == "slurm":  # Slurm's own inventory; job files under the data directory
        return cls.from_environment(root=options.data_dir / "slurm", **options.backend_options)
    if options.backend == "local":
        if options.inventory is None:
            raise LoomInputError("the local backend needs an inventory file (--inventory FILE)", field="inventory")
        from loom.service.backends.inventory import load_inventory

        inventory = load_inventory(options.inventory)
        root = inventory.settings.root or options.data_dir / "local"
        return cls(inventory, root=root, **options.backend_options)
    if options.inventory is not None:  # the nodes of an inventory file, emulated
        from loom.service.backends.inventory import load_inventory

        return cls(load_inventory(options.inventory).topology, **options.backend_options)
    if options.cluster is None:
        raise LoomInputError(f"the {options.backend} backend needs --cluster NAME or --inventory FILE",
                             field="cluster")
    from loom.hardware.clusters import load_cluster

    return cls(load_cluster(options.cluster), **options.backend_options)


def _save_inventory(store: Any, backend: Any) -> None:
    inventory = backend.inventory()
    topo = inventory.topology
    nodes = [{"name": name, "gpus": int(topo.node_gpus[i]), "gpu_type": topo.gpu_types[int(topo.node_type[i])],
              "state": "up", "path": [str(topo.switch_names[t][int(topo.switch_of[t, i])]) for t in range(len(topo.tiers))]}
             for i, name in enumerate(topo.node_names)]
    saved = store.inventory()
    if saved is None:
        store.save_inventory(inventory.generation, nodes)
    elif saved[1] != nodes:  # the inventory file changed between runs: a new generation
        store.save_inventory(saved[0] + 1, nodes)


def serve(options: ServeOptions, *, announce: Any = print) -> None:
    """Run the service until interrupted (uvicorn handles SIGINT/SIGTERM)."""
    import uvicorn

    runner = Runner(options)
    runner.start()
    announce(f"Loom serving on http://{options.host}:{options.port} (backend {options.backend}, policy "
             f"{options.policy}, store {_masked(options.db_url)}); dashboard at /dashboard; admin token in "
             f"{runner.admin_token_path}")
    if runner.reconciled is not None and (runner.reconciled.adopted or runner.reconciled.requeued):
        announce(runner.reconciled.line())
    try:
        uvicorn.run(runner.app(), host=options.host, port=options.port, log_level="warning")
    finally:
        runner.stop()


def _masked(url: str) -> str:
    from loom.service.store.connect import masked

    return masked(url)
