"""The meter's pure parts (docs/decisions/0161-metering-upstream-bytes.md): the access log lines
of an upstream Squid, hostile ones included, into usage per lease; the whole lines of a read;
records whose message ids are the range's; the log directives; the lease helper's note."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events.meter import MAX_BYTES, UpstreamMetered, problem
from services.providers.pure import meterlog
from services.providers.pure.meterlog import MAX_LINE, Tally, split, tally
from services.providers.pure.squidconf import METER_FORMAT, meter_log_lines, squid_config
from services.providers.squidauth import helper

LEASE = "5f0c8a4e-2b1d-4c5e-9f7a-0d3b6e8c1a24"
T0 = datetime(2026, 12, 7, 18, 0, tzinfo=UTC)


def line(up: int = 180, down: int = 747, result: str = "TCP_MISS", lease: str = LEASE) -> bytes:
    return f"1796668038.323 {up} {down} {result} {lease}".encode()


def test_lines_are_summed_per_lease_and_the_probe_has_none() -> None:
    counted = tally(
        [
            line(),
            line(up=238, down=678, result="TCP_TUNNEL"),
            line(up=10, down=20, lease="-"),
            line(lease="other-lease"),
        ]
    )
    assert set(counted.usage) == {LEASE, "", "other-lease"}
    ours = counted.usage[LEASE]
    assert (ours.requests, ours.bytes_up, ours.bytes_down) == (2, 418, 1425)
    probe = counted.usage[""]
    assert (probe.requests, probe.bytes_up, probe.bytes_down) == (1, 10, 20)
    assert counted.skipped == {}
    assert counted.denied == 0


def test_what_squid_denied_never_reached_the_service_and_is_not_metered() -> None:
    counted = tally([line(result="TCP_DENIED", lease="-"), line(result="TCP_DENIED_REPLY")])
    assert counted.usage == {}
    assert counted.denied == 2


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"x" * MAX_LINE, "long"),
        (line() + b" extra", "garbage"),
        (b"1796668038.323 180 747 TCP_MISS", "garbage"),
        (b"1796668038.323  180 747 TCP_MISS " + LEASE.encode(), "garbage"),
        (b"1796668038 180 747 TCP_MISS " + LEASE.encode(), "garbage"),
        (line(up=-1), "garbage"),
        (b"1796668038.323 1e9 747 TCP_MISS " + LEASE.encode(), "garbage"),
        (b"1796668038.323 \xd9\xa3 747 TCP_MISS " + LEASE.encode(), "garbage"),  # Arabic 3
        (b"1796668038.323 99999999999999999 1 TCP_MISS " + LEASE.encode(), "garbage"),
        (b"1796668038.323 1 1 tcp_miss " + LEASE.encode(), "garbage"),
        (b"\x00\xff\xfe garbage \x1b[31m", "garbage"),
        (line(lease="a,b"), "lease"),
        (line(lease="lease%20id"), "lease"),
        (line(lease="x" * 129), "lease"),
        (b"1796668038.323 1 1 TCP_MISS l\xc3\xa9ase", "lease"),
        (line(lease='"quoted"'), "lease"),
        (line(up=0, down=0, result="NONE_NONE", lease="-"), "empty"),
        (line(up=0, down=0), "empty"),
    ],
)
def test_a_hostile_line_is_skipped_and_counted_by_reason(raw: bytes, reason: str) -> None:
    counted = Tally()
    meterlog.parse_line(raw, counted)
    assert counted.usage == {}
    assert counted.skipped == {reason: 1}


def test_sums_stop_at_what_a_record_may_hold() -> None:
    big = 10**16 - 1
    counted = tally([line(up=big, down=big)] * 1000)
    assert counted.usage[LEASE].bytes_up == MAX_BYTES == counted.usage[LEASE].bytes_down


def test_a_read_takes_whole_lines_and_leaves_a_line_being_written() -> None:
    data = line() + b"\n" + line() + b"\n" + b"1796668038.3"
    chunk = split(data, skipping=False, final=False)
    assert chunk.lines == [line(), line()]
    assert chunk.used == 2 * (len(line()) + 1)
    assert not chunk.skipping


def test_a_final_read_takes_the_last_line_without_its_end() -> None:
    chunk = split(line() + b"\n" + b"torn", skipping=False, final=True)
    assert chunk.lines == [line(), b"torn"]
    assert chunk.used == len(line()) + 5


def test_a_line_too_long_is_taken_cut_and_its_rest_dropped_by_the_next_read() -> None:
    first = split(line() + b"\n" + b"y" * (MAX_LINE + 5), skipping=False, final=False)
    assert first.skipping
    assert first.lines[-1] == b"y" * MAX_LINE
    assert first.used == len(line()) + 1 + MAX_LINE + 5
    still = split(b"y" * 100, skipping=True, final=False)
    assert still.lines == []
    assert still.used == 100
    assert still.skipping
    rest = split(b"yyy\n" + line() + b"\n", skipping=True, final=False)
    assert rest.lines == [line()]
    assert not rest.skipping
    assert rest.used == 4 + len(line()) + 1
    counted = tally(first.lines)
    assert counted.skipped == {"long": 1}
    assert counted.usage[LEASE].requests == 1


def test_records_one_per_lease_with_ids_of_the_range_not_of_the_clock() -> None:
    source = meterlog.Source("resi-de", "uid-1", "proxy-uid", 3, budget_bytes_per_day=5000)
    counted = tally([line(), line(lease="-")])

    def made(first: int, end: int, at: datetime, replica: str) -> list[str]:
        new = meterlog.records(
            source, counted, first=first, end=end, replica=replica, start=at, interval=10.0
        )
        for item in new:
            assert isinstance(item.event, UpstreamMetered)
            assert problem(item.event) is None
        return [item.msg_id for item in new]

    ids = made(0, 100, T0, "a")
    assert len(ids) == 2
    assert len(set(ids)) == 2
    assert made(0, 100, T0.replace(hour=19), "b") == ids  # the same range read again
    assert set(made(100, 200, T0, "a")).isdisjoint(ids)
    other = meterlog.Source("resi-de", "uid-1", "proxy-uid", 4)
    again = meterlog.records(other, counted, first=0, end=100, replica="a", start=T0, interval=1)
    assert {n.msg_id for n in again}.isdisjoint(ids)  # another file of the instance
    event = meterlog.records(source, counted, first=0, end=1, replica="a", start=T0, interval=5)[
        1
    ].event
    assert isinstance(event, UpstreamMetered)
    usage = (event.lease_id, event.requests, event.bytes_up, event.bytes_down)
    assert usage == (LEASE, 1, 180, 747)
    assert (event.budget_bytes_per_day, event.proxy_uid, event.provider) == (
        5000,
        "proxy-uid",
        "resi-de",
    )


def test_the_log_directives_of_an_upstream_squid_and_none_for_others() -> None:
    lines = meter_log_lines("/var/lib/egress/x/access.log")
    assert lines[0].startswith(f"logformat {METER_FORMAT} ")
    assert lines[0].endswith("%note{lease}")
    assert lines[1] == f"access_log stdio:/var/lib/egress/x/access.log logformat={METER_FORMAT}"
    assert "logfile_rotate 0" in lines
    assert "buffered_logs off" in lines

    def config(access_log: str = "") -> list[str]:
        made = squid_config(
            listen="3128", name="n", cache_log="/c", coredump_dir="/d", access_log=access_log
        )
        return made.splitlines()

    metered = config("/l/access.log")
    assert "access_log none" not in metered
    assert lines[1].replace("/var/lib/egress/x", "/l") in metered
    plain = config()
    assert "access_log none" in plain
    assert not any(x.startswith("logformat") for x in plain)


@pytest.mark.parametrize("path", ["relative/access.log", "/a b/access.log", "/a\n/b", "/a\tb", ""])
def test_a_log_path_squid_would_misread_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match="absolute path without spaces"):
        meter_log_lines(path)


@pytest.mark.parametrize(
    ("user", "answer"),
    [
        (f"{LEASE}.7.1796668038000.{'a' * 32}", f"OK lease={LEASE}"),
        (f"crawl.lease:1.7.1796668038000.{'a' * 32}", "OK lease=crawl.lease:1"),
        (f"egress-probe.1796668038000.{'a' * 32}", "OK"),
        (f"a,b.7.1796668038000.{'a' * 32}", "OK"),
        (f"{'x' * 129}.7.1796668038000.{'a' * 32}", "OK"),
    ],
)
def test_the_helper_names_a_lease_in_a_note_a_log_can_carry(user: str, answer: str) -> None:
    assert helper.noted(user, "OK") == answer
    assert helper.noted(user, 'ERR message="lease expired"') == 'ERR message="lease expired"'
    note = answer.partition("lease=")[2]
    assert not note or meterlog.LEASE_ID.match(note.encode())
