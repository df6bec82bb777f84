"""The gcp provider's pure tables: error classification per status and reason, GCE status to
instance state, labels, provider ids and timestamps."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events.schemas import InstanceState
from services.providers.base import (
    MANAGED_LABEL,
    OWNER_LABEL,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.gcp.pure import mapping
from services.providers.gcp.pure.classify import classify


@pytest.mark.parametrize(
    ("status", "reasons", "op", "expected"),
    [
        # NotFound: the instance is not there (a normal answer for get and delete).
        (404, ["notFound"], "get", NotFound),
        (404, [], "delete", NotFound),
        (404, ["notFound"], "list", NotFound),
        # ...but on create, a 404 names a missing image, machine type or network: bad spec.
        (404, ["notFound"], "create", Permanent),
        # Quota and capacity, whatever the status they arrive with.
        (403, ["quotaExceeded"], "create", QuotaExceeded),
        (429, ["quotaExceeded"], "create", QuotaExceeded),
        (403, ["QUOTA_EXCEEDED"], "create", QuotaExceeded),
        (503, ["ZONE_RESOURCE_POOL_EXHAUSTED"], "create", QuotaExceeded),
        (None, ["ZONE_RESOURCE_POOL_EXHAUSTED"], "create", QuotaExceeded),
        (None, ["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"], "create", QuotaExceeded),
        (None, ["QUOTA_EXCEEDED"], "create", QuotaExceeded),
        (403, ["forbidden", "quotaExceeded"], "create", QuotaExceeded),
        # Rate limits and server trouble: retry with backoff.
        (403, ["rateLimitExceeded"], "get", Transient),
        (403, ["userRateLimitExceeded"], "list", Transient),
        (429, ["rateLimitExceeded"], "create", Transient),
        (429, [], "create", Transient),
        (None, ["RESOURCE_OPERATION_RATE_EXCEEDED"], "create", Transient),
        (500, ["backendError"], "get", Transient),
        (500, [], "get", Transient),
        (502, [], "list", Transient),
        (503, [], "delete", Transient),
        (504, [], "create", Transient),
        (408, [], "get", Transient),
        (409, ["resourceInUseByAnotherResource"], "delete", Transient),
        (412, ["conditionNotMet"], "delete", Transient),
        (400, ["resourceNotReady"], "delete", Transient),
        # Invalid or denied: latch Failed until the spec (or the IAM binding) changes.
        (400, ["invalid"], "create", Permanent),
        (400, [], "create", Permanent),
        (401, ["authError"], "get", Permanent),
        (403, ["forbidden"], "create", Permanent),
        (403, ["accessNotConfigured"], "list", Permanent),
        (403, ["insufficientPermissions"], "delete", Permanent),
        (None, ["INVALID_FIELD_VALUE"], "create", Permanent),
        (None, [], "create", Permanent),
        # Something in between answered a redirect as an error.
        (302, [], "get", Transient),
    ],
)
def test_classification_table(
    status: int | None, reasons: list[str], op: str, expected: type[ProviderError]
) -> None:
    assert classify(status, reasons, op=op) is expected


def test_reasons_match_whatever_their_spelling() -> None:
    for spelling in ("quotaExceeded", "QUOTA_EXCEEDED", "quota-exceeded", "QuotaExceeded"):
        assert classify(403, [spelling]) is QuotaExceeded
    assert classify(403, ["", "forbidden"]) is Permanent


@pytest.mark.parametrize(
    ("status", "ip", "expected"),
    [
        ("PROVISIONING", "", InstanceState.PENDING),
        ("STAGING", "", InstanceState.PENDING),
        ("STAGING", "10.0.0.1", InstanceState.PENDING),
        ("RUNNING", "10.0.0.1", InstanceState.RUNNING),
        ("RUNNING", "", InstanceState.PENDING),
        ("REPAIRING", "10.0.0.1", InstanceState.PENDING),
        ("STOPPING", "10.0.0.1", InstanceState.STOPPED),
        ("STOPPED", "", InstanceState.STOPPED),
        ("SUSPENDING", "", InstanceState.STOPPED),
        ("SUSPENDED", "", InstanceState.STOPPED),
        ("TERMINATED", "", InstanceState.STOPPED),
        ("SOMETHING_NEW", "", InstanceState.UNKNOWN),
        ("", "", InstanceState.UNKNOWN),
    ],
)
def test_state_mapping(status: str, ip: str, expected: InstanceState) -> None:
    assert mapping.state_of(status, ip) is expected


def test_our_label_keys_become_valid_gce_keys_and_come_back() -> None:
    ours = {
        MANAGED_LABEL: "true",
        OWNER_LABEL: "8d3c7a2e-1f00-4c1b-9d7e-000000000001",
        mapping.PROVIDER_LABEL: "gcp-eu",
        mapping.SPEC_HASH_LABEL: "0123abcd",
    }
    gce = mapping.labels_to_gcp(ours)
    for key in gce:
        assert mapping.LABEL_KEY.match(key), key
    assert mapping.labels_from_gcp(gce) == ours
    assert mapping.labels_from_gcp({"team": "crawl"}) == {"team": "crawl"}


def test_label_values_are_checked_not_rewritten() -> None:
    assert mapping.label_value("owner-1_x") == "owner-1_x"
    assert mapping.label_value("") == ""
    for bad in ("Owner", "a/b", "x" * 64, "ü"):
        assert mapping.label_value(bad) is None
    assert mapping.provider_label_value("GCP-EU") == "gcp-eu"


def test_list_filter_names_managed_and_this_provider() -> None:
    assert mapping.list_filter("GCP-eu") == (
        '(labels.egress_proxies_managed = "true") (labels.egress_proxies_provider = "gcp-eu")'
    )


def test_provider_ids_round_trip_and_foreign_ids_are_refused() -> None:
    pid = mapping.provider_id("europe-west1-b", "px-1")
    assert pid == "zones/europe-west1-b/instances/px-1"
    assert mapping.parse_provider_id(pid) == ("europe-west1-b", "px-1")
    for bad in ("px-1", "zones/x/instances/", "zones/X/instances/a", "zones/a/instances/b/c", ""):
        assert mapping.parse_provider_id(bad) is None


def test_timestamps_become_utc() -> None:
    assert mapping.parse_timestamp("2024-05-01T03:04:05.123-07:00") == datetime(
        2024, 5, 1, 10, 4, 5, 123000, tzinfo=UTC
    )
    assert mapping.parse_timestamp("2024-05-01T10:04:05Z").utcoffset() is not None
    assert mapping.short_name("https://x/compute/v1/projects/p/zones/us-east1-b") == "us-east1-b"
    assert mapping.short_name("zones/us-east1-b") == "us-east1-b"
