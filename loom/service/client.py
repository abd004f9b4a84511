"""A small Python client for the service's REST API (what `loom submit | status | …` use).

Where to connect and as whom: `--url` / `--token`, else `$LOOM_URL` / `$LOOM_TOKEN`, else the
client config file (`$LOOM_CLIENT_CONFIG`, default `~/.config/loom/client.yaml`, keys `url` and
`token`), else `http://127.0.0.1:8470` with no token. Every failure is a `ServiceError` with the
service's own message (it names the field), never an HTTP library's traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import yaml

from loom.errors import LoomInputError

DEFAULT_URL = "http://127.0.0.1:8470"
PAGE = 1000


class ServiceError(LoomInputError):
    """The service refused a request (4xx/5xx) or could not be reached."""


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None


def config_path() -> Path:
    return Path(os.environ.get("LOOM_CLIENT_CONFIG") or Path.home() / ".config" / "loom" / "client.yaml")


def resolve(url: str | None = None, token: str | None = None) -> Target:
    """Where to connect and with which token (flags, then environment, then the config file)."""
    file: dict[str, Any] = {}
    path = config_path()
    if (url is None or token is None) and path.is_file():
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise LoomInputError(f"cannot read the client config: {exc}", source=str(path)) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise LoomInputError("expected a mapping with keys 'url' and 'token'", source=str(path))
        file = loaded or {}
        unknown = sorted(set(file) - {"url", "token"})
        if unknown:
            raise LoomInputError(f"unknown key(s) {unknown}; expected 'url' and 'token'", source=str(path))
    return Target(url=(url or os.environ.get("LOOM_URL") or file.get("url") or DEFAULT_URL).rstrip("/"),
                  token=token or os.environ.get("LOOM_TOKEN") or file.get("token"))


class Client:
    def __init__(self, target: Target, *, timeout: float = 30.0) -> None:
        self.target = target
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self._http = httpx.Client(base_url=target.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(f"cannot reach the Loom service at {self.target.url}: {exc}") from None
        if response.status_code >= 400:
            raise ServiceError(_message(response))
        return response.json() if response.content else None

    # ------------------------------------------------------------------ the API
    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", "/v1/jobs", json=spec, headers=headers)

    def status(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/jobs/{job_id}/cancel")

    def jobs(self, *, all: bool = False, states: list[str] | None = None) -> list[dict[str, Any]]:
        """Every job asked for (fetched a page at a time)."""
        params: dict[str, Any] = {"all": str(all).lower(), "limit": PAGE}
        if states:
            params["state"] = states
        out: list[dict[str, Any]] = []
        while True:
            page = self.request("GET", "/v1/jobs", params=params)["jobs"]
            out.extend(page)
            if len(page) < PAGE:
                return out
            params["after"] = page[-1]["job_id"]

    def nodes(self) -> dict[str, Any]:
        return self.request("GET", "/v1/nodes")

    def drain(self, node: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/nodes/{node}/drain")

    def undrain(self, node: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/nodes/{node}/undrain")

    def policy(self, **changes: Any) -> dict[str, Any]:
        """The policy settings; with `paused=` / `round_interval=`, change them first (admin)."""
        if changes:
            return self.request("PATCH", "/v1/policy", json=changes)
        return self.request("GET", "/v1/policy")

    def explain(self, job_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/jobs/{job_id}/explain")

    def create_tenant(self, name: str, *, admin: bool = False) -> dict[str, Any]:
        return self.request("POST", "/v1/tenants", json={"name": name, "admin": admin})

    def events(self, *, after: int = 0, follow: bool = False) -> Iterator[dict[str, Any]]:
        """Server-sent events, parsed; with `follow` the stream stays open."""
        params = {"after": after, "follow": str(follow).lower()}
        try:
            with self._http.stream("GET", "/v1/events", params=params, timeout=None if follow else 30.0) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ServiceError(_message(response))
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        yield json.loads(line[len("data: "):])
        except httpx.HTTPError as exc:
            raise ServiceError(f"cannot reach the Loom service at {self.target.url}: {exc}") from None


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    error = body.get("error") if isinstance(body, dict) else None
    return f"HTTP {response.status_code}: {error or body}"
