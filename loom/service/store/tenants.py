"""Tenants and their API tokens.

A token is `secrets.token_urlsafe(32)` (256 random bits), shown once and stored only as
its SHA-256. A slow password hash buys nothing for a random secret of that size, and a
plain digest lets `authenticate` find the row by index; the final comparison is
constant-time all the same.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

import sqlalchemy as sa

from loom.errors import LoomInputError, did_you_mean
from loom.service.store import validate as check
from loom.service.store.base import StoreBase
from loom.service.store.rows import Tenant
from loom.service.store.schema import tenants, tokens

MAX_TOKEN_LEN = 512  # anything longer is not one of ours: refuse before hashing


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TenantsMixin(StoreBase):
    def create_tenant(self, name: str, *, admin: bool = False) -> tuple[Tenant, str]:
        """A new tenant and its first token (the only time the token is seen in clear)."""
        name = check.tenant_name(name, "name")
        now = time.time()
        with self._write() as c:
            if c.execute(sa.select(tenants.c.name).where(tenants.c.name == name)).first():
                raise LoomInputError(f"tenant '{name}' already exists", field="name")
            c.execute(tenants.insert().values(name=name, admin=bool(admin), created_at=now))
            token = self._new_token(c, name, now)
        return Tenant(name, bool(admin), now), token

    def add_token(self, tenant: str) -> str:
        """Another token for `tenant` (e.g. to rotate: add, switch clients, revoke the old)."""
        tenant = check.tenant_name(tenant)
        with self._write() as c:
            self._require_tenant(c, tenant)
            return self._new_token(c, tenant, time.time())

    def revoke_token(self, token: str) -> bool:
        """Forget a token; False if it was not known."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LEN:
            return False
        with self._write() as c:
            return bool(c.execute(tokens.delete().where(tokens.c.hash == token_hash(token))).rowcount)

    def authenticate(self, token: str) -> Tenant | None:
        """The tenant a token belongs to, or None."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LEN:
            return None
        digest = token_hash(token)
        q = (sa.select(tokens.c.hash, tenants.c.name, tenants.c.admin, tenants.c.created_at)
             .join(tenants, tenants.c.name == tokens.c.tenant).where(tokens.c.hash == digest))
        with self._read() as c:
            row = c.execute(q).first()
        if row is None or not hmac.compare_digest(row.hash, digest):
            return None
        return Tenant(row.name, bool(row.admin), row.created_at)

    def tenants(self) -> list[Tenant]:
        with self._read() as c:
            rows = c.execute(sa.select(tenants).order_by(tenants.c.name)).all()
        return [Tenant(r.name, bool(r.admin), r.created_at) for r in rows]

    def tenant(self, name: str) -> Tenant | None:
        try:
            check.tenant_name(name)
        except LoomInputError:
            return None
        with self._read() as c:
            r = c.execute(sa.select(tenants).where(tenants.c.name == name)).first()
        return None if r is None else Tenant(r.name, bool(r.admin), r.created_at)

    def _new_token(self, c: sa.Connection, tenant: str, now: float) -> str:
        token = secrets.token_urlsafe(32)
        c.execute(tokens.insert().values(hash=token_hash(token), tenant=tenant, created_at=now))
        return token

    def _require_tenant(self, c: sa.Connection, tenant: str, field: str = "tenant") -> None:
        """Tenants are never deleted, so one that was seen once is known for good (saves a
        round trip under the write lock on every submission)."""
        if tenant in self._known_tenants:
            return
        if c.execute(sa.select(tenants.c.name).where(tenants.c.name == tenant)).first() is None:
            known = c.execute(sa.select(tenants.c.name)).scalars().all()
            raise LoomInputError(f"no tenant '{tenant}'{did_you_mean(tenant, known)}", field=field)
        self._known_tenants.add(tenant)
