"""The invariants of the chaos soak: pure functions of what clients were told and what the log
holds.

They are kept apart from processes and clocks so that each one can be fed a made-up record (an
overlapping pair, a ghost grant, a lost release) and be seen to flag it: a check that cannot fail
proves nothing. Every figure is computed from the records handed in; nothing is assumed.

Times are seconds since the epoch. The clients' clock and the JetStream timestamps come from
the same machine, so they can be compared directly.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from events import reading
from events.schemas import LeaseAcquired, LeaseReleased, LeaseReported
from events.store import Recorded
from events.subjects import LEASE_STREAM, proxy_uid_of
from projections import lease, lease_queries
from projections.proxy import ProxyView

OK = "ok"
BUSY = "busy"
UNAVAILABLE = "unavailable"
ERROR = "error"
NO_ANSWER = "no_answer"
"""Sent, and nothing came back (a timeout, a reset): the client cannot know what happened."""
UNREACHABLE = "unreachable"
"""The connection was refused: the request never left the client."""
OUTCOMES = (OK, BUSY, UNAVAILABLE, ERROR, NO_ANSWER, UNREACHABLE)
EVIDENCE = 10
"""Lines of evidence kept per check: enough to start a diagnosis, not a dump."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP exchange as the client saw it."""

    sent_at: float
    answered_at: float | None = None
    status: int | None = None
    code: str = ""
    """The ``error`` of an error body, or why no answer came."""
    sent: bool = True

    @property
    def outcome(self) -> str:
        if self.status is None:
            return NO_ANSWER if self.sent else UNREACHABLE
        if 200 <= self.status < 300:
            return OK
        if self.status == 503:
            return BUSY if self.code == "no_proxy_available" else UNAVAILABLE
        return ERROR

    @property
    def told_failed(self) -> bool:
        """The client knows the write did not happen (an error answer, or it never left)."""
        return self.outcome not in (OK, NO_ANSWER)


@dataclass(frozen=True, slots=True)
class Acquisition:
    holder: str
    """Unique per request: how a claim in the log is traced back to the request that made it."""
    answer: Answer
    lease_id: str = ""
    proxy_uid: str = ""
    acquired_at: float = 0.0
    expires_at: float = 0.0
    token: int = 0
    proxy_url: str = ""


@dataclass(frozen=True, slots=True)
class Call:
    """A release (``DELETE``) or a report on a lease; ``tag`` is a report's unique detail."""

    lease_id: str
    answer: Answer
    tag: str = ""


@dataclass
class Grant:
    """A lease as the fold granted it, and how the fold ended it ("" while current)."""

    lease_id: str
    proxy_uid: str
    holder: str
    acquired_at: float
    expires_at: float
    token: int
    seq: int
    end: str = ""
    ended_at: float | None = None
    withdrawn: bool = False
    """Ended by the system's withdrawal (``LeaseReleased.withdrawn``), not by its holder."""

    @property
    def until(self) -> float:
        return self.ended_at if self.ended_at is not None else self.expires_at


@dataclass
class LeaseLog:
    """The LEASE stream folded from sequence 1 with ``projections.lease``."""

    events: int = 0
    claims: Counter[str] = field(default_factory=Counter)
    """``LeaseAcquired`` events per lease id, granted or not."""
    grants: dict[str, Grant] = field(default_factory=dict)
    reports: set[str] = field(default_factory=set)
    """Details of the reports the fold recorded."""
    refused: int = 0
    ignored: int = 0
    """Claims, releases and reports the fold ignored as late or unusable."""


def fold_log(events: Iterable[Recorded]) -> LeaseLog:
    """Every grant and every end, in stream order, as the services' own fold sees them."""
    out = LeaseLog()
    views: dict[str, lease.LeaseView] = {}
    for recorded in events:
        out.events += 1
        uid = proxy_uid_of(recorded.subject)
        before = views.get(uid)
        # As the services fold: an event the fold cannot apply moves the view past it.
        after, _ = reading.apply_tolerantly(lease.apply, before, recorded, LEASE_STREAM)
        if after is None:
            continue
        views[uid] = after
        out.refused += after.rejected - (before.rejected if before else 0)
        ignored = after.late + after.unusable - (before.late + before.unusable if before else 0)
        out.ignored += ignored
        old = before.current if before else None
        new = after.current
        if old is not None and (new is None or new.lease_id != old.lease_id):
            ended = lease_queries.find(after, old.lease_id)
            grant = out.grants.get(old.lease_id)
            if grant is not None and ended is not None and ended.ended_at is not None:
                grant.end, grant.ended_at = ended.end, ended.ended_at.timestamp()
                event = recorded.event
                grant.withdrawn = isinstance(event, LeaseReleased) and event.withdrawn
        match recorded.event:
            case LeaseAcquired(lease_id=lease_id, holder=holder):
                out.claims[lease_id] += 1
                record = lease_queries.find(after, lease_id)
                fresh = old is None or old.lease_id != lease_id
                if record is not None and new is not None and new.lease_id == lease_id and fresh:
                    out.grants[lease_id] = Grant(
                        lease_id=lease_id,
                        proxy_uid=uid,
                        holder=holder,
                        acquired_at=record.acquired_at.timestamp(),
                        expires_at=record.expires_at.timestamp(),
                        token=record.fencing_token,
                        seq=recorded.seq,
                    )
            case LeaseReported(detail=detail) if not ignored:
                out.reports.add(detail)
            case _:
                pass
    return out


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    value: float | None
    target: str
    ok: bool
    evidence: tuple[str, ...] = ()


def clock(at: float | None) -> str:
    """UTC, to the millisecond, as the services' logs print it: evidence is read next to them."""
    if at is None:
        return "never"
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]


def told(answer: Answer) -> str:
    """What the client was told, and when it asked."""
    said = f"{answer.status} {answer.code}".rstrip() if answer.status else answer.outcome
    return f"{said} (sent {clock(answer.sent_at)})"


def _check(name: str, found: list[str], target: str = "0") -> Check:
    return Check(name, len(found), target, not found, tuple(found[:EVIDENCE]))


def client_holds(
    acquisitions: Iterable[Acquisition], releases: Iterable[Call]
) -> list[tuple[str, str, float, float]]:
    """(proxy, lease, from, until) of every lease a client was told it holds. It holds from the
    ``acquiredAt`` of its 201 until ``expiresAt``, or until it *sent* its first release: a
    release takes effect somewhere between sending it and its 204, and any later bound would
    flag a successor the cooldown let in legitimately."""
    first_sent: dict[str, float] = {}
    for call in releases:
        at = first_sent.get(call.lease_id)
        first_sent[call.lease_id] = min(at, call.answer.sent_at) if at else call.answer.sent_at
    holds = []
    for a in acquisitions:
        if a.answer.outcome == OK:
            until = min(a.expires_at, first_sent.get(a.lease_id, a.expires_at))
            holds.append((a.proxy_uid, a.lease_id, a.acquired_at, until))
    return holds


def overlaps(holds: Iterable[tuple[str, str, float, float]]) -> list[str]:
    """Holds of one proxy that overlap in time, with both lease ids."""
    by_proxy: dict[str, list[tuple[str, str, float, float]]] = defaultdict(list)
    for hold in holds:
        by_proxy[hold[0]].append(hold)
    found = []
    for uid, items in sorted(by_proxy.items()):
        items.sort(key=lambda h: h[2])
        latest: tuple[str, str, float, float] | None = None
        for hold in items:
            if latest is not None and hold[2] < latest[3]:
                found.append(
                    f"proxy {uid}: lease {hold[1]} from {clock(hold[2])} while {latest[1]} "
                    f"held it until {clock(latest[3])}"
                )
            if latest is None or hold[3] > latest[3]:
                latest = hold
    return found


def check_double_leases(
    acquisitions: list[Acquisition], releases: list[Call], log: LeaseLog
) -> Check:
    """Clients' view: no two holds overlap. The log's: the fold never had two current holders
    (each grant starts after its predecessor ended), and each fencing token is its grant's stream
    sequence, so a proxy's tokens strictly increase
    (docs/decisions/0080-fencing-tokens-are-the-grant-s.md)."""
    found = [f"clients: {line}" for line in overlaps(client_holds(acquisitions, releases))]
    logged = [(g.proxy_uid, g.lease_id, g.acquired_at, g.until) for g in log.grants.values()]
    found += [f"log: {line}" for line in overlaps(logged)]
    by_proxy: dict[str, list[Grant]] = defaultdict(list)
    for grant in log.grants.values():
        by_proxy[grant.proxy_uid].append(grant)
    for uid, grants in sorted(by_proxy.items()):
        ordered = sorted(grants, key=lambda g: g.seq)
        tokens, seqs = [g.token for g in ordered], [g.seq for g in ordered]
        if tokens != seqs:
            found.append(
                f"log: proxy {uid}: fencing tokens {tokens[:20]} are not the grants' "
                f"sequences {seqs[:20]}"
            )
    return _check("double leases", found)


def _disagrees(a: Acquisition, g: Grant) -> str:
    if g.proxy_uid != a.proxy_uid or g.holder != a.holder or g.token != a.token:
        return f"proxy/holder/token {g.proxy_uid}/{g.holder}/{g.token}"
    if abs(g.acquired_at - a.acquired_at) > 1e-3 or abs(g.expires_at - a.expires_at) > 1e-3:
        return f"times {clock(g.acquired_at)}-{clock(g.expires_at)}"
    return ""


def check_lost(
    acquisitions: list[Acquisition],
    releases: list[Call],
    reports: list[Call],
    log: LeaseLog,
    *,
    applied: Mapping[str, str],
    proxies: Mapping[str, ProxyView],
) -> Check:
    """Everything acknowledged is in the log, as acknowledged: 201 leases granted by the fold
    with the answer's proxy, times and token; 204 releases ended the lease as released; 204
    reports recorded; every applied proxy (uid -> namespace/name) still declared."""
    found = []
    for a in acquisitions:
        if a.answer.outcome != OK:
            continue
        grant = log.grants.get(a.lease_id)
        if a.lease_id not in log.claims:
            found.append(f"lease {a.lease_id} (201) is not in the LEASE stream")
        elif grant is None:
            found.append(f"lease {a.lease_id} (201) is in the log but the fold did not grant it")
        elif diff := _disagrees(a, grant):
            found.append(f"lease {a.lease_id} (201): the log has other {diff}")
    for call in releases:
        if call.answer.outcome == OK:
            grant = log.grants.get(call.lease_id)
            end = grant.end if grant else "not granted"
            if end != lease.RELEASED:
                found.append(f"release of {call.lease_id} (204): the log says {end or 'held'}")
    for call in reports:
        if call.answer.outcome == OK and call.tag not in log.reports:
            found.append(f"report {call.tag} on {call.lease_id} (204) is not recorded")
    for uid, name in sorted(applied.items()):
        view = proxies.get(uid)
        if view is None or view.removed or f"{view.namespace}/{view.name}" != name:
            found.append(f"proxy {name} ({uid}) is not in the PROXY stream as declared")
    return _check("acknowledged events lost", found)


def ghost_leases(acquisitions: list[Acquisition], log: LeaseLog) -> tuple[Check, int, int]:
    """Grants the fold made for a request the client was told had failed (or for a request
    that got another lease, or for a holder no client used); apart, the grants for requests
    that got no answer (ambiguous, not ghosts) and the grants the system withdrew because their
    requester had been told they failed (the acknowledgement was lost in an outage: the lease
    held its proxy only until the log could be read again)."""
    by_holder = {a.holder: a for a in acquisitions}
    found = []
    ambiguous = 0
    withdrawn = 0
    for grant in sorted(log.grants.values(), key=lambda g: g.seq):
        asked = by_holder.get(grant.holder)
        if asked is None:
            found.append(f"lease {grant.lease_id} granted to {grant.holder!r}: no such request")
        elif asked.answer.outcome == NO_ANSWER:
            ambiguous += 1
        elif asked.answer.told_failed and grant.withdrawn:
            withdrawn += 1
        elif asked.answer.told_failed:
            found.append(
                f"lease {grant.lease_id} on {grant.proxy_uid} granted at seq {grant.seq} "
                f"({clock(grant.acquired_at)}) to {grant.holder}, which was answered "
                f"{told(asked.answer)}"
            )
        elif asked.lease_id != grant.lease_id:
            found.append(
                f"lease {grant.lease_id} granted to {grant.holder}, whose 201 named "
                f"{asked.lease_id}"
            )
    return _check("ghost leases", found), ambiguous, withdrawn


def ghost_writes(releases: list[Call], reports: list[Call], log: LeaseLog) -> Check:
    """Releases and reports that took effect although every attempt was answered as failed. A
    claim the system withdrew (``ghost_leases`` counts those) was released by no client: no
    DELETE is expected of it."""
    calls: dict[str, list[Call]] = defaultdict(list)
    for call in releases:
        calls[call.lease_id].append(call)
    found = []
    for grant in sorted(log.grants.values(), key=lambda g: g.seq):
        if grant.end != lease.RELEASED or grant.withdrawn:
            continue
        answers = [c.answer for c in calls.get(grant.lease_id, [])]
        outcomes = {a.outcome for a in answers}
        if OK not in outcomes and NO_ANSWER not in outcomes:
            found.append(
                f"lease {grant.lease_id} of {grant.holder!r} on {grant.proxy_uid} ended as "
                f"released at {clock(grant.ended_at)}; its DELETEs: "
                f"{'; '.join(map(told, answers)) or 'none'}"
            )
    by_tag = {c.tag: c for c in reports}
    for tag in sorted(log.reports):
        asked = by_tag.get(tag)
        if asked is None or asked.answer.told_failed:
            said = told(asked.answer) if asked else "never sent"
            found.append(f"report {tag} is recorded; its request: {said}")
    return _check("ghost releases and reports", found)


def check_converged(seconds: float | None, limit: float, stragglers: list[str]) -> Check:
    target = f"<= {limit:.0f} s"
    if seconds is not None and seconds <= limit:
        return Check("fleet converged after the last fault", seconds, target, True)
    return Check("fleet converged after the last fault", seconds, target, False, tuple(stragglers))


def tally(answers: Iterable[Answer]) -> dict[str, int]:
    counts = Counter(a.outcome for a in answers)
    return {outcome: counts[outcome] for outcome in OUTCOMES}
