"""Run a function as a small local torchrun-style job: N forked processes (for tests and examples).

Forking from a process that already imported torch costs milliseconds instead of
the seconds an interpreter start and `import torch` take on a loaded machine, so
tests can afford several runs of a job. Each child gets torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) plus the caller's `env`,
and ends the way `python script.py` does: an uncaught exception goes through
`sys.excepthook`, the child's own `atexit` handlers run (inherited ones are
dropped), and the exit status is that of the script.

Importing this module puts MKL in its conditional-numerical-reproducibility mode
(`MKL_CBWR=AUTO,STRICT`, unless set): MKL otherwise picks a code path by the
memory alignment of its operands, and a resumed process allocates differently from
an uninterrupted one, so a matrix product can differ in the last bit between them
(measured: `x @ w.T` for a 4x16 `x` at 12 of 15 misalignments). MKL reads the
variable at its first call, so this must happen before the process's first matrix
product — tests import this module at collection.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

@dataclass(frozen=True)
class ProcessResult:
    """How one process of a local job ended."""

    rank: int
    exitcode: int | None  # None: still running when the job was killed
    error: str | None  # the uncaught exception, one line


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(fn: Callable[..., Any], args: tuple, env: dict[str, str], conn: Any) -> None:
    atexit._clear()  # type: ignore[attr-defined] - the parent's handlers are not ours to run
    os.environ.update(env)
    import torch

    torch.set_num_threads(1)
    code, error = 0, None
    try:
        fn(*args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - report anything, as the interpreter would
        code, error = 1, f"{type(exc).__name__}: {exc}"
        sys.excepthook(type(exc), exc, exc.__traceback__)
    try:
        atexit._run_exitfuncs()  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    conn.send(error)
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class LocalJob:
    """`nprocs` forked processes running `fn(*args)` with torchrun's variables set."""

    def __init__(self, fn: Callable[..., Any], nprocs: int, env: dict[str, str] | None = None,
                 args: tuple = ()) -> None:
        ctx = mp.get_context("fork")
        port = str(free_port())
        self._procs, self._conns = [], []
        for rank in range(nprocs):
            child_env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nprocs),
                         "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": port, **(env or {})}
            reader, writer = ctx.Pipe(duplex=False)
            self._procs.append(ctx.Process(target=_child, args=(fn, args, child_env, writer), daemon=True))
            self._conns.append(reader)

    def start(self) -> LocalJob:
        for proc in self._procs:
            proc.start()
        return self

    def join(self, timeout_s: float = 120.0) -> list[ProcessResult]:
        """Wait for every process; as torchrun does, once one fails the others are killed
        (they would wait for it in a collective), and all are killed past the timeout."""
        deadline = time.monotonic() + timeout_s
        while any(p.is_alive() for p in self._procs):
            failed = any(p.exitcode not in (None, 0) for p in self._procs)
            if failed or time.monotonic() >= deadline:
                self.kill()
                break
            time.sleep(0.02)
        results = []
        for rank, (proc, conn) in enumerate(zip(self._procs, self._conns)):
            try:
                error = conn.recv() if conn.poll() else None
            except (EOFError, OSError):
                error = None
            results.append(ProcessResult(rank, proc.exitcode, error))
        return results

    def kill(self, sig: int = signal.SIGKILL) -> None:
        for proc in self._procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, sig)
        for proc in self._procs:
            proc.join(10)

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self._procs]



def run_local(fn: Callable[..., Any], nprocs: int, env: dict[str, str] | None = None,
              args: tuple = (), timeout_s: float = 120.0) -> list[ProcessResult]:
    """Start a local job and wait for it."""
    return LocalJob(fn, nprocs, env, args).start().join(timeout_s)


def tiny_job(out: str, epochs: int = 3, sleep_s: float = 0.0, samples: int = 96) -> None:
    """A small DDP training script with the one-line opt-in, logging `iteration epoch loss.hex()`.

    It draws from every stream a checkpoint must restore (dropout: torch; noise: NumPy
    and Python), steps an LR scheduler after the optimizer, and runs with or without
    torch.distributed (RANK set or not). One log file per **logical** rank,
    `<out>.<logical rank>` (the process rank unless the world is virtualised).
    """
    import random

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import loom.runtime

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    model = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
    g = torch.Generator().manual_seed(1)
    dataset = torch.utils.data.TensorDataset(torch.randn(samples, 8, generator=g),
                                             torch.randn(samples, 1, generator=g))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)

    model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader, lr_scheduler=scheduler)

    runtime = loom.runtime.current()
    logs = {r: open(f"{out}.{r}", "a") for r in runtime.logical_ranks}  # noqa: SIM115 - closed below
    try:
        for epoch in range(epochs):
            for x, y in loader:
                noise = float(np.random.randn()) * 1e-3 + random.random() * 1e-3
                loss = torch.nn.functional.mse_loss(model(x), y) + noise
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
                log = logs[runtime.logical_rank]
                log.write(f"{runtime.iteration} {epoch} {loss.item().hex()}\n")
                log.flush()
                loom.runtime.report(loss=loss)
                if sleep_s:
                    time.sleep(sleep_s)
    finally:
        for log in logs.values():
            log.close()
    if distributed:
        dist.destroy_process_group()


def squash_fault(scale: float) -> None:
    """Make this process's squashed gradients `scale` times too large (tests of squash validation;
    call it in the job's process before `wrap`)."""
    from loom.runtime import gradients

    gradients.SQUASH_FAULT = scale


def read_losses(path: str) -> list[tuple[int, int, str]]:
    """A `tiny_job` log: (iteration, epoch, loss.hex()) per line, in the order written."""
    with open(path) as handle:
        return [(int(i), int(e), loss) for i, e, loss in (line.split() for line in handle)]
