"""What counts as a durable changed behind the service's back (``services.runtime.nats.durable``):
each kind named on its own, and the durable as declared, or restored by a replica, counts as
none. The restoring runs against a real server in tests/integration/test_consumer_drift.py."""

from __future__ import annotations

from datetime import UTC, datetime

from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy, SequenceInfo

from services.runtime.nats.durable import KINDS, RESTORED, drifts, filters
from tests.support.workload import spec

DECLARED = spec("reconciler")


def found(config: ConsumerConfig, floor: int = 0) -> ConsumerInfo:
    return ConsumerInfo(
        name="reconciler",
        stream_name="PROXY",
        config=config,
        created=datetime(2026, 1, 1, tzinfo=UTC),
        ack_floor=SequenceInfo(consumer_seq=floor, stream_seq=floor),
    )


def changed(**fields: object) -> ConsumerConfig:
    config = DECLARED.config()
    for name, value in fields.items():
        setattr(config, name, value)
    return config


def test_as_declared_or_restored_is_no_drift() -> None:
    assert drifts(DECLARED.config(), found(DECLARED.config()), floor=None) == []
    assert drifts(DECLARED.config(), found(DECLARED.config(41)), floor=40) == []
    # Restored by a sibling replica that saw a later floor: marked, so not taken for a change.
    assert drifts(DECLARED.config(), found(DECLARED.config(90)), floor=40) == []
    one = changed(filter_subjects=None, filter_subject="proxy.*.health")
    assert drifts(DECLARED.config(), found(one), floor=3) == []


def test_each_kind_of_change_is_named() -> None:
    declared = DECLARED.config()
    assert drifts(declared, None, floor=7) == ["vanished"]
    assert drifts(declared, found(changed(filter_subjects=["proxy.*.gone"])), 7) == ["filter"]
    assert drifts(declared, found(changed(deliver_policy=DeliverPolicy.NEW)), 7) == [
        "deliver_policy"
    ]
    assert drifts(declared, found(changed(ack_policy=AckPolicy.NONE)), 7) == ["ack_policy"]
    later = changed(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=50, metadata={})
    assert drifts(declared, found(later), floor=7) == ["start"]
    assert drifts(declared, found(later), floor=49) == []
    assert {"vanished", "filter", "deliver_policy", "ack_policy", "start"} == set(KINDS)


def test_a_restore_is_marked_and_starts_where_asked() -> None:
    config = DECLARED.config(12)
    assert config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
    assert (config.opt_start_seq, config.metadata) == (12, {RESTORED: "12"})
    assert DECLARED.config().deliver_policy == DeliverPolicy.ALL
    assert filters(config) == {"proxy.*.health"}
