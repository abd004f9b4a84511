"""`loom localize`: find faulty nodes among emulated ones with Acme's two-round all-gather test."""

from __future__ import annotations

import json
import random
import sys

import typer

from loom.cli.errors import err_console, user_errors
from loom.errors import LoomInputError

KINDS = ("hang", "crash", "wrong", "slow")  # loom.localize.FAULT_KINDS (not imported: keeps `loom --help` light)
METHOD_NAMES = ("pairwise", "all-pairs")


def register(app: typer.Typer) -> None:
    app.command("localize")(localize)


@user_errors
def localize(
    nodes: str = typer.Option("8", "--nodes", metavar="N|a,b,c", help="How many emulated nodes (named n0..n{N-1}) "
                              "or their names, comma-separated."),
    faulty: str = typer.Option(None, "--faulty", metavar="NODE:KIND,...", help="Faults to inject: hang, crash, "
                               "wrong, slow or slow:SECONDS, e.g. n3:hang,n7:wrong."),
    random_faults: int = typer.Option(0, "--random-faults", metavar="K", help="Also make K other nodes faulty, "
                                      "with random kinds (see --seed)."),
    seed: int = typer.Option(0, "--seed", help="Seed for --random-faults."),
    method: str = typer.Option("pairwise", "--method", metavar="pairwise|all-pairs", help="pairwise: Acme's two "
                               "rounds; all-pairs: every pair once (the naive baseline)."),
    timeout: float = typer.Option(5.0, "--timeout", metavar="S", help="Each test's timeout in seconds (a hung "
                                  "node costs a round about S + 1 + S/4 s)."),
    tensor_bytes: int = typer.Option(1 << 20, "--tensor-bytes", metavar="B", help="Bytes each node contributes."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout and nothing else there."),
) -> None:
    """Run all-gather tests between agents standing for nodes; report the faulty nodes and the time taken."""
    names = _node_names(nodes)
    faults = _faults(faulty, names)
    faults.update(_random_faults(random_faults, seed, names, faults))
    if method not in METHOD_NAMES:
        raise LoomInputError(f"unknown method '{method}' (known: {', '.join(METHOD_NAMES)})", field="--method")
    if not timeout > 0:
        raise LoomInputError(f"must be a positive number of seconds (got {timeout:g})", field="--timeout")
    from loom.localize import localize as run_localize

    with err_console.status("starting agents", spinner="dots") as status:
        result = run_localize(names, faults, method=method, timeout_s=timeout, tensor_bytes=tensor_bytes,
                              progress=lambda text: status.update(text))
    if as_json:
        sys.stdout.write(json.dumps({**result.to_dict(), "injected": faults}, indent=2) + "\n")
        return
    _show(result, faults)


def _node_names(text: str) -> tuple[str, ...]:
    text = text.strip()
    if text.isdigit():
        names = tuple(f"n{i}" for i in range(int(text)))
    else:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
    if len(names) < 2:
        raise LoomInputError(f"localisation needs at least 2 nodes (got {len(names)})", field="--nodes")
    if len(set(names)) != len(names):
        raise LoomInputError("node names must be distinct", field="--nodes")
    return names


def _faults(text: str | None, names: tuple[str, ...]) -> dict[str, str]:
    faults: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        node, _, kind = item.strip().partition(":")
        if node not in names:
            raise LoomInputError(f"'{node}' is not one of the nodes ({_listed(names)})", field="--faulty")
        if kind.partition(":")[0] not in KINDS:
            raise LoomInputError(f"unknown fault kind '{kind}' for {node} (known: {', '.join(KINDS)}; "
                                 "e.g. n3:hang, n2:slow:0.5)", field="--faulty")
        from loom.localize import Fault

        try:
            faults[node] = Fault.parse(kind).spec()
        except LoomInputError as exc:
            raise LoomInputError(exc.message, field="--faulty") from None
    return faults


def _random_faults(k: int, seed: int, names: tuple[str, ...], taken: dict[str, str]) -> dict[str, str]:
    free = [n for n in names if n not in taken]
    if k < 0 or k > len(free):
        raise LoomInputError(f"must be between 0 and {len(free)} (the nodes not already faulty)",
                             field="--random-faults")
    rng = random.Random(seed)
    return {node: rng.choice(KINDS) for node in sorted(rng.sample(free, k), key=names.index)}


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:3])}, …, {names[-1]}"


def _show(result, faults: dict[str, str]) -> None:
    from rich.table import Table

    from loom.cli.common import WideConsole

    console = WideConsole()
    if faults:
        console.print("injected: " + ", ".join(f"{n}:{k}" for n, k in faults.items()), highlight=False)
    table = Table("round", "group", "outcome", "time s", "detail")
    for rnd in result.rounds:
        for i, group in enumerate(rnd.groups):
            style = {"pass": "green", "fail": "red", "slow": "yellow"}[group.outcome]
            table.add_row(rnd.name if i == 0 else "", ", ".join(group.members), f"[{style}]{group.outcome}[/]",
                          "—" if group.seconds is None else f"{group.seconds:.3f}", group.detail)
    console.print(table)
    verdict = ", ".join(result.faulty) if result.faulty else "none"
    console.print(f"[bold]faulty:[/] {verdict}", highlight=False)
    if result.undetermined:
        console.print(f"[bold yellow]undetermined:[/] {', '.join(result.undetermined)}", highlight=False)
    for note in result.notes:
        console.print(note, style="dim", highlight=False, soft_wrap=True)
    console.print(f"{result.method}: {result.tests} tests in {len(result.rounds)} rounds, {result.seconds:.2f} s "
                  f"(+ {result.startup_seconds:.2f} s starting {len(result.nodes)} agents)", highlight=False)
