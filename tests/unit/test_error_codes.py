"""The API's error codes are one table (services/discovery/pure/errorcodes.py); everything else that
names a code is held to it here: the server's exceptions, the OpenAPI document, docs/api.md's
table, and the client library's copy (it may not import the product, so a test compares)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from egress_proxies_client import _protocol
from egress_proxies_client.errors import (
    AuthError,
    EgressError,
    Forbidden,
    LeaseEnded,
    LeaseLimit,
    LeaseRevoked,
    NoMatchingProxy,
    NoProxyAvailable,
    UnknownLease,
    UnknownPool,
    UnknownProxy,
)
from egress_proxies_client.errors import Unavailable as ClientUnavailable
from services.discovery.http import access, errors
from services.discovery.http.app import DiscoveryApi, create_app
from services.discovery.leasing import rotation
from services.discovery.leasing.leases import Leases
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.errorcodes import FOR_STATUS, RETRY_LATER, STATUS, ErrorCode
from services.discovery.pure.policy import LeasePolicy
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.observability.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]

# What the client raises for each code; a code not here is an EgressError carrying the code.
CLIENT_TYPES: dict[ErrorCode, type[EgressError]] = {
    ErrorCode.NO_MATCHING_PROXY: NoMatchingProxy,
    ErrorCode.NO_PROXY_AVAILABLE: NoProxyAvailable,
    ErrorCode.LEASE_LIMIT: LeaseLimit,
    ErrorCode.UNKNOWN_LEASE: UnknownLease,
    ErrorCode.LEASE_ENDED: LeaseEnded,
    ErrorCode.LEASE_REVOKED: LeaseRevoked,
    ErrorCode.UNKNOWN_PROXY: UnknownProxy,
    ErrorCode.UNKNOWN_POOL: UnknownPool,
    ErrorCode.UNAUTHORIZED: AuthError,
    ErrorCode.FORBIDDEN: Forbidden,
    ErrorCode.NOT_YOUR_LEASE: Forbidden,
    ErrorCode.UNAVAILABLE: ClientUnavailable,
}


def test_every_code_has_one_status_and_every_generic_status_a_code() -> None:
    assert set(STATUS) == set(ErrorCode)
    for status, code in FOR_STATUS.items():
        assert STATUS[code] == status, code
    assert set(ErrorCode) >= RETRY_LATER


def test_each_server_exception_answers_with_its_codes_status() -> None:
    raised = [
        cls
        for module in (errors, access, rotation)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, errors.ApiError)
    ]
    assert len(raised) >= 10
    for cls in raised:
        assert isinstance(cls.code, ErrorCode), cls
        assert cls.status == STATUS[cls.code], cls


def test_the_openapi_document_lists_exactly_the_codes() -> None:
    store = InMemoryEventStore()
    views = Views(None, store)  # type: ignore[arg-type]  # no JetStream: nothing is read
    metrics = Metrics()
    leases = Leases(store, views, LeasePolicy(), DiscoveryMetrics(metrics.registry))
    document = create_app(DiscoveryApi(leases, views, metrics)).openapi_schema.to_schema()
    schemas = document["components"]["schemas"]
    body = next(s for name, s in schemas.items() if name.endswith("ErrorBody"))
    error = body["properties"]["error"]
    if "$ref" in error:
        error = schemas[error["$ref"].rsplit("/", 1)[1]]
    assert sorted(error["enum"]) == sorted(code.value for code in ErrorCode)


def test_the_docs_table_is_the_table() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", section, re.MULTILINE)
    assert sorted((code, int(status)) for status, code in rows) == sorted(
        (code.value, status) for code, status in STATUS.items()
    )


@pytest.mark.parametrize("code", list(ErrorCode))
def test_the_client_raises_what_each_code_means(code: ErrorCode) -> None:
    content = f'{{"error": "{code.value}", "message": "m"}}'.encode()
    raised = _protocol.error(STATUS[code], {"retry-after": "3"}, content, "http://api")
    assert type(raised) is CLIENT_TYPES.get(code, EgressError)
    assert raised.code == code.value
    if isinstance(raised, NoProxyAvailable | ClientUnavailable):
        assert code in RETRY_LATER


def test_the_client_names_no_code_the_server_does_not_have() -> None:
    source = inspect.getsource(_protocol.error)
    named = set(re.findall(r'"([a-z]+(?:_[a-z]+)+)"', source))
    assert named, "the client's error mapping names no code"
    assert named <= {code.value for code in ErrorCode}
