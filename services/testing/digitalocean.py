"""A local HTTP fake of the DigitalOcean API endpoints the digitalocean provider calls.

The provider is tested through the real ``pydo`` async client (``endpointUrl`` pointing here), so
request encoding, paging and error decoding are the library's own, not a mock's. The fake follows
DigitalOcean's public API reference for the calls used:

- ``/v2/droplets``: POST (202, ``status: new``), GET list (``tag_name`` or ``name``, ``page`` /
  ``per_page`` up to 200, ``links.pages`` and ``meta.total``), GET by id, DELETE by id (204);
- ``/v2/firewalls``: POST (202), GET list, GET by id, PUT by id (the whole firewall), DELETE (204);
  a firewall may name only tags that exist, and must have a valid name and rules;
- ``/v2/tags``: GET by name, POST (201);
- ``/v2/sizes`` (paged, each size with its ``regions`` and ``available``), ``/v2/images/{id or
  slug}``, ``/v2/account`` (``droplet_limit``, ``status``): the catalogue in
  ``digitalocean_catalogue``; a create of a size outside its regions answers 422 "Size is not
  available in this region.";
- the Bearer token is checked on every call (401 ``Unauthorized`` otherwise); errors have
  DigitalOcean's shape, ``{"id": "...", "message": "..."}``, and every answer carries the
  ``ratelimit-*`` headers.

A droplet moves ``new`` -> ``active`` one step per GET of it, getting a public IPv4 address from
``addresses`` (by default distinct 127.0.1.x addresses; the e2e passes ``["127.0.0.1"]`` so a
local Squid stands in for every droplet). ``inject`` answers the next calls of a kind with an
error (status, DigitalOcean error id, message, headers); ``power_off``, ``destroy`` and
``archive`` act behind the provider's back; ``droplet_limit`` refuses creates as the account
limit does (and is what ``/v2/account`` answers); ``account_status`` is the account's status. The
account itself (what each call answers) is ``digitalocean_api.FakeAccount``; this module
is the HTTP server around it, the token check, the faults and the controls.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from services.testing import cloud_http, digitalocean_api
from services.testing.cloud_http import Fault, Reply, Request
from services.testing.digitalocean_api import (
    LIMIT_MESSAGE,
    REGIONS,
    Answer,
    Droplet,
    FakeAccount,
)
from services.testing.digitalocean_catalogue import (
    IMAGES,
    LIMITED_REGIONS,
    LIMITED_SIZE,
    SIZES,
)

__all__ = [
    "DEFAULT_TOKEN",
    "IMAGES",
    "KINDS",
    "LIMITED_REGIONS",
    "LIMITED_SIZE",
    "LIMIT_MESSAGE",
    "REGIONS",
    "SIZES",
    "DigitalOceanFake",
    "Droplet",
]

KINDS = (
    "droplets.create",
    "droplets.list",
    "droplets.get",
    "droplets.delete",
    "firewalls.create",
    "firewalls.list",
    "firewalls.get",
    "firewalls.update",
    "firewalls.delete",
    "tags.get",
    "tags.create",
    "sizes.list",
    "images.get",
    "account.get",
    "any",
)
DEFAULT_TOKEN = "dop_v1_fake_token_for_tests"


class DigitalOceanFake(FakeAccount, cloud_http.FakeServer):
    """The fake server; use as a context manager (``with DigitalOceanFake() as fake``). The
    account's state (``droplets``, ``firewalls``, ``tags``) is readable by tests."""

    thread_name = "do-fake"

    def __init__(
        self, *, token: str = DEFAULT_TOKEN, addresses: Sequence[str] | None = None
    ) -> None:
        FakeAccount.__init__(self, addresses)
        cloud_http.FakeServer.__init__(self, KINDS)
        self.token = token
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.calls: list[str] = []

    # ---------------------------------------------------------------- control

    def inject(
        self,
        kind: str,
        status: int,
        error_id: str,
        message: str = "",
        *,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` calls of ``kind`` with this DigitalOcean error."""
        text = message or f"injected {error_id} ({status})"
        self.add_fault(kind, Fault(status, error_id, text, times, dict(headers or {})))

    def power_off(self, droplet_id: int) -> None:
        with self._lock:
            self.droplets[droplet_id].body["status"] = "off"
            self.droplets[droplet_id].steps.clear()

    def archive(self, droplet_id: int) -> None:
        with self._lock:
            self.droplets[droplet_id].body["status"] = "archive"
            self.droplets[droplet_id].steps.clear()

    def destroy(self, droplet_id: int) -> None:
        """Destroy behind the provider's back (a person in the control panel)."""
        with self._lock:
            del self.droplets[droplet_id]

    def delete_firewall(self, firewall_id: str) -> None:
        with self._lock:
            del self.firewalls[firewall_id]

    def put(self, name: str, tags: list[str], status: str = "active") -> int:
        """A droplet made by someone else, for listing tests."""
        with self._lock:
            droplet_id = next(self._ids)
            body = self._droplet_body(droplet_id, {"name": name, "tags": tags}, status)
            self.droplets[droplet_id] = Droplet(body, deque())
            self.tags.update(tags)
            return droplet_id

    def calls_of(self, kind: str) -> int:
        with self._lock:
            return self.calls.count(kind)

    def by_name(self, name: str) -> list[Droplet]:
        with self._lock:
            return [d for d in self.droplets.values() if d.body["name"] == name]

    # ---------------------------------------------------------------- dispatch

    def serve(self, request: Request) -> Reply:
        status, answer, extra = self._answer(request)
        headers = cloud_http.merge_headers(
            {
                "ratelimit-limit": "5000",
                "ratelimit-remaining": "4999",
                "ratelimit-reset": str(int(time.time()) + 60),
            },
            extra,
        )
        return cloud_http.json_reply(
            status, answer, headers, content_type="application/json; charset=utf-8"
        )

    def _answer(self, request: Request) -> Answer:
        route = digitalocean_api.route(request.method, request.path)
        query = request.params
        with self._lock:
            self.requests.append((request.method, request.path, query))
            if route is not None:
                self.calls.append(route[0])
        if request.header("authorization") != f"Bearer {self.token}":
            return digitalocean_api.error(401, "Unauthorized", "Unable to authenticate you")
        if route is None:
            return digitalocean_api.not_found()
        kind, arg = route
        fault = self.fault_for(kind)
        if fault is not None:
            status, answer, extra = digitalocean_api.error(fault.status, fault.code, fault.message)
            return status, answer, {**extra, **fault.headers}
        with self._lock:
            return self.answer(
                kind,
                arg,
                base=self.url,
                path=request.path,
                query=query,
                payload=cloud_http.parse_json(request.body),
            )
