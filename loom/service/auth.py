"""Who is calling: a bearer token per tenant (stored hashed by the store), an admin token for
node, tenant and policy operations."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Annotated

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
    tenant = request.app.state.service.store.authenticate(token.strip())
    if tenant is None:
        raise ApiError(401, "unknown token", "authorization")
    return Caller(tenant.name, bool(tenant.admin))


Who = Annotated[Caller, Depends(authenticate)]  # a route's caller (a 401 without a valid token)
