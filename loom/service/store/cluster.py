"""The cluster as the store knows it: the node inventory with its generation, node
states, and reservations. Cluster events go to the event log without a tenant, so
only admins' streams carry them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from loom.errors import LoomInputError, did_you_mean
from loom.service.store import validate as check
from loom.service.store.base import StoreError
from loom.service.store.ledger import LedgerMixin
from loom.service.store.rows import NODE_STATES, ReservationRow
from loom.service.store.schema import NAME_LEN, inventory, reservations
from loom.service.store.schema import nodes as node_table

NODE_KEYS = ("name", "gpus", "gpu_type", "state", "path")


def _node(i: int, node: Any) -> dict[str, Any]:
    """One inventory entry, checked: {name, gpus, gpu_type, state (default up), path (default [])}."""
    where = f"nodes[{i}]"
    if not isinstance(node, dict):
        raise LoomInputError(f"must be an object with {', '.join(NODE_KEYS)}", field=where)
    for key in node:
        if key not in NODE_KEYS:
            raise LoomInputError(f"unknown key {key!r}{did_you_mean(str(key), NODE_KEYS)}", field=f"{where}.{key}")
    for key in ("name", "gpus", "gpu_type"):
        if key not in node:
            raise LoomInputError("missing", field=f"{where}.{key}")
    gpu_type = node["gpu_type"]
    if not isinstance(gpu_type, str) or not 0 < len(gpu_type) <= NAME_LEN:
        raise LoomInputError(f"must be a GPU type name of at most {NAME_LEN} characters", field=f"{where}.gpu_type")
    path = node.get("path", [])
    if not isinstance(path, list | tuple) or not all(isinstance(p, str) for p in path):
        raise LoomInputError("must be a list of switch names, root first", field=f"{where}.path")
    return {
        "name": check.label(node["name"], f"{where}.name"),
        "gpus": check.integer(node["gpus"], f"{where}.gpus"),
        "gpu_type": gpu_type,
        "state": check.choice(node.get("state", "up"), NODE_STATES, f"{where}.state"),
        "path": list(path),
    }


class ClusterMixin(LedgerMixin):
    def save_inventory(self, generation: int, nodes: list[dict[str, Any]]) -> None:
        """Replace the node inventory with generation `generation` (never older than the one
        stored). Node order is kept: it is the topology's node order."""
        generation = check.integer(generation, "generation")
        checked = [_node(i, n) for i, n in enumerate(nodes)]
        seen: set[str] = set()
        for i, n in enumerate(checked):
            if n["name"] in seen:
                raise LoomInputError(f"node '{n['name']}' listed twice", field=f"nodes[{i}].name")
            seen.add(n["name"])
        now = time.time()
        with self._write() as c:
            old = c.execute(sa.select(inventory.c.generation).where(inventory.c.id == 1)).scalar_one_or_none()
            if old is not None and generation < old:
                raise LoomInputError(f"generation {generation} is older than the stored generation {old}",
                                     field="generation")
            c.execute(node_table.delete())
            if checked:
                c.execute(node_table.insert(), [{**n, "position": i, "updated_at": now} for i, n in enumerate(checked)])
            if old is None:
                c.execute(inventory.insert().values(id=1, generation=generation, saved_at=now))
            else:
                c.execute(inventory.update().where(inventory.c.id == 1).values(generation=generation, saved_at=now))
            self._emit(c, now, "inventory", None, None, {"generation": generation, "nodes": len(checked)})

    def inventory(self) -> tuple[int, list[dict[str, Any]]] | None:
        """(generation, nodes in inventory order), or None before the first save."""
        with self._read() as c:
            generation = c.execute(sa.select(inventory.c.generation).where(inventory.c.id == 1)).scalar_one_or_none()
            if generation is None:
                return None
            rows = c.execute(sa.select(node_table).order_by(node_table.c.position)).all()
        return generation, [{k: getattr(r, k) for k in NODE_KEYS} for r in rows]

    def set_node_state(self, node: str, state: str, at: float) -> None:
        """A node went down, came up or was drained."""
        node = check.label(node, "node")
        state = check.choice(state, NODE_STATES, "state")
        at = check.time_s(at)
        with self._write() as c:
            if not c.execute(node_table.update().where(node_table.c.name == node).values(state=state, updated_at=at)).rowcount:
                known = c.execute(sa.select(node_table.c.name)).scalars().all()
                raise LoomInputError(f"no node '{node}' in the inventory{did_you_mean(str(node), known)}",
                                     field="node")
            self._emit(c, at, "node", None, None, {"node": node, "state": state})

    # ------------------------------------------------------------------ reservations
    def record_reservation(self, reservation_id: int, nodes: Sequence[str], until: float, for_job: str,
                           reason: str, at: float) -> None:
        """Nodes held until `until` for `for_job` (the core's Reserve decision, by node name)."""
        rid = check.integer(reservation_id, "reservation_id")
        names = [check.label(n, f"nodes[{i}]") for i, n in enumerate(nodes)]
        until, at = check.time_s(until, "until"), check.time_s(at)
        with self._write() as c:
            if c.execute(sa.select(reservations.c.reservation_id)
                         .where(reservations.c.reservation_id == rid)).first():
                raise StoreError(f"reservation {rid} is already recorded (reservation ids must be unique)")
            c.execute(reservations.insert().values(reservation_id=rid, nodes=names, until=until, for_job=str(for_job),
                                                   reason=str(reason), created_at=at))
            self._emit(c, at, "reservation", None, None,
                       {"reservation_id": rid, "nodes": names, "until": until, "for_job": str(for_job)})

    def release_reservation(self, reservation_id: int, at: float, reason: str = "") -> bool:
        """End a reservation; False if it was unknown or already released."""
        at = check.time_s(at)
        with self._write() as c:
            done = c.execute(reservations.update()
                             .where(reservations.c.reservation_id == reservation_id,
                                    reservations.c.released_at.is_(None))
                             .values(released_at=at, release_reason=str(reason))).rowcount
            if done:
                self._emit(c, at, "release", None, None, {"reservation_id": reservation_id, "reason": str(reason)})
        return bool(done)

    def reservations(self, *, active: bool = True) -> list[ReservationRow]:
        """Reservations not yet released (all of them with active=False), oldest first."""
        q = sa.select(reservations).order_by(reservations.c.reservation_id)
        if active:
            q = q.where(reservations.c.released_at.is_(None))
        with self._read() as c:
            rows = c.execute(q).all()
        return [ReservationRow(r.reservation_id, tuple(r.nodes), r.until, r.for_job, r.reason, r.created_at,
                               r.released_at, r.release_reason) for r in rows]
