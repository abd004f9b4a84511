"""Who is calling: a bearer token per tenant (stored hashed by the store), an admin token for
node, tenant and policy operations."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request


class ApiError(Exception):
    """A 4xx for the client, with the field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


@dataclass(frozen=True)
class Caller:
    tenant: str
    admin: bool

    @property
    def scope(self) -> str | None:
        """Whose jobs the caller sees: its own, or everyone's (None) for an admin."""
        return None if self.admin else self.tenant

    def require_admin(self) -> None:
        if not self.admin:
            raise ApiError(403, "this operation needs an admin token", "authorization")


def authenticate(request: Request) -> Caller:
    """FastAPI dependency: the caller behind `Authorization: Bearer TOKEN`, or a 401."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or len(token) > 512:
        raise ApiError(401, "missing or malformed token: send 'Authorization: Bearer TOKEN'", "authorization")
    tenant = _cached(request.app.state.service.store, token.strip())
    if tenant is None:
        raise ApiError(401, "unknown token", "authorization")
    return Caller(tenant.name, bool(tenant.admin))


TOKEN_CACHE_S = 5.0  # a revoked token is refused at most this long after
_cache: dict[tuple[int, str], tuple[float, Any]] = {}
_cache_lock = threading.Lock()


def _cached(store: Any, token: str) -> Any:
    """`store.authenticate(token)`, remembered for a few seconds: every request carries a token,
    and a database read per request is most of the cost of a cheap one. Keyed by the token's
    hash (the plaintext is not kept) and the store; unknown tokens are not remembered."""
    key = (id(store), hashlib.sha256(token.encode()).hexdigest())
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and now - hit[0] < TOKEN_CACHE_S:
        return hit[1]
    tenant = store.authenticate(token)
    if tenant is not None:
        with _cache_lock:
            if len(_cache) > 10_000:
                _cache.clear()
            _cache[key] = (now, tenant)
    return tenant


Who = Annotated[Caller, Depends(authenticate)]  # a route's caller (a 401 without a valid token)
