"""How the CLI shows pools (``get pools``, ``describe pool``): pure functions from the folded
views to rows, items and rich renderables (docs/architecture.md, "Pools").

A member's state is judged exactly as the pool controller judges it
(``projections.pool_members``), so READY or LEASED here
are the figures its next decision will see. Every name and message from the log goes through
``inert``, like every other table of the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import msgspec
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from events.durations import format_duration
from events.pool import PoolDecided, PoolFigures
from projections.lease import LeaseView
from projections.pool import Planned, PoolView
from projections.pool_members import MemberState, figures, member_state
from projections.proxy import ProxyView
from services.cli.pure.render import format_time, inert

POOL_COLUMNS = ("NAMESPACE", "NAME", "DESIRED", "MEMBERS", "READY", "HEALTHY", "LEASED", "AGE")
WIDE_COLUMNS = ("GEN", "STATUS", "UID", "LAST DECISION")
DECISIONS_SHOWN = 10


@dataclass(frozen=True, slots=True)
class Member:
    """A member as shown: what the pool planned, what its Proxy and lease say now."""

    planned: Planned
    state: MemberState
    proxy: ProxyView | None


@dataclass(frozen=True, slots=True)
class PoolRow:
    view: PoolView
    figures: PoolFigures
    members: tuple[Member, ...]
    """Active members by ordinal, then retired ones whose Proxy is not removed yet."""


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision with the time the log stored it."""

    at: datetime
    event: PoolDecided


def pool_row(
    view: PoolView,
    proxies: Mapping[str, ProxyView],
    leases: Mapping[str, LeaseView],
    now: datetime,
) -> PoolRow:
    def member(planned: Planned) -> Member:
        uid = planned.member.uid
        proxy = proxies.get(uid)
        return Member(planned, member_state(uid, proxy, leases.get(uid), now), proxy)

    active = [member(p) for p in view.active()]
    retiring = [m for m in map(member, view.retired()) if m.state.declared]
    states = {m.planned.member.uid: m.state for m in active}
    return PoolRow(view, figures(view, states), tuple(active + retiring))


def age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    seconds = int((now - since).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def status(view: PoolView) -> str:
    return "Removed" if view.removed else "Deleting" if view.deleting else "Active"


def decision_line(event: PoolDecided | None) -> str:
    if event is None:
        return "-"
    return f"{event.reason}: {event.message}" if event.message else event.reason


def pools_table(rows: Sequence[PoolRow], now: datetime, *, wide: bool = False) -> Table:
    out = Table(box=None, pad_edge=False, header_style="bold")
    columns = POOL_COLUMNS + WIDE_COLUMNS if wide else POOL_COLUMNS
    for column in columns:
        numeric = column in ("DESIRED", "MEMBERS", "READY", "HEALTHY", "LEASED", "GEN")
        out.add_column(
            column,
            justify="right" if numeric else "left",
            no_wrap=column != "LAST DECISION",
            overflow="fold",
        )
    for row in rows:
        seen = row.figures
        cells: list[Text | str] = [
            inert(row.view.namespace),
            inert(row.view.name),
            str(seen.desired),
            str(seen.members),
            str(seen.ready),
            str(seen.healthy),
            str(seen.leased),
            age(row.view.created_at, now),
        ]
        if wide:
            cells += [
                str(row.view.generation),
                status(row.view),
                inert(row.view.uid),
                inert(decision_line(row.view.last_decision)),
            ]
        out.add_row(*cells)
    return out


def member_item(member: Member) -> dict[str, object]:
    planned, state = member.planned, member.state
    return {
        "name": planned.member.name,
        "uid": planned.member.uid,
        "ordinal": planned.member.ordinal,
        "provider": planned.member.provider,
        "retired": planned.retired_at is not None,
        "declared": state.declared,
        "phase": state.phase or None,
        "ready": state.ready,
        "healthy": state.healthy,
        "leased": state.leased,
        "rotating": state.rotating,
    }


def pool_item(row: PoolRow) -> dict[str, object]:
    """One pool for ``-o json``/``yaml``: the spec as the log keeps it (durations in seconds)."""
    view = row.view
    last = view.last_decision
    return {
        "uid": view.uid,
        "namespace": view.namespace,
        "name": view.name,
        "generation": view.generation,
        "source": view.source,
        "status": status(view),
        "desired": view.replicas,
        "spec": msgspec.to_builtins(view.spec),
        "figures": figures_item(row.figures),
        "members": [member_item(m) for m in row.members],
        "lastDecision": None
        if last is None
        else {
            "reason": last.reason,
            "message": last.message,
            "time": format_time(view.decided_at) if view.decided_at else None,
            "figures": figures_item(last.figures),
        },
        "createdAt": format_time(view.created_at) if view.created_at else None,
    }


def figures_item(seen: PoolFigures) -> dict[str, object]:
    """Every figure, zeros included (the log's encoding leaves them out)."""
    return {f: msgspec.to_builtins(getattr(seen, f)) for f in seen.__struct_fields__}


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _figures(seen: PoolFigures) -> str:
    text = (
        f"desired {seen.desired}, members {seen.members}, ready {seen.ready}, "
        f"healthy {seen.healthy}, leased {seen.leased}, rotating {seen.rotating}"
    )
    if seen.unserved or seen.waiting or seen.refused:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(seen.refused.items())) or "none"
        text += f"; unserved {seen.unserved} (waiting {seen.waiting}, refused {refused})"
    return text


def _fields(pairs: Sequence[tuple[str, str]]) -> Table:
    out = Table(box=None, pad_edge=False, show_header=False)
    out.add_column(style="bold", no_wrap=True)
    out.add_column(overflow="fold")
    for label, value in pairs:
        out.add_row(f"{label}:", inert(value))
    return out


def _spec(row: PoolRow) -> list[tuple[str, str]]:
    spec, view = row.view.spec, row.view
    template = spec.template
    attributes = ", ".join(f"{k}={v}" for k, v in sorted(template.attributes.items()))
    spread = ", ".join(f"{e.provider} (weight {e.weight})" for e in spec.spread)
    scaled = "" if view.replicas == spec.replicas else f" (scaled; the spec says {spec.replicas})"
    auto = spec.autoscale
    if auto is not None:
        since = format_time(view.pressure_since) if view.pressure_since else "-"
        scaled = (
            f" (autoscaled {auto.min}..{auto.max}, target {auto.target_leased:g} leased, up "
            f"after {format_duration(auto.scale_up_after_seconds)}, down after "
            f"{format_duration(auto.scale_down_after_seconds)}; load {view.pressure} since "
            f"{since})"
        )
    return [
        ("  Replicas", f"{view.replicas}{scaled}"),
        ("  Provider", template.provider or "-"),
        ("  Spread", spread or "-"),
        ("  Attributes", attributes or "-"),
        ("  Mode", str(template.mode.value)),
        ("  Max age", format_duration(spec.max_age_seconds) if spec.max_age_seconds else "never"),
        ("  Recycle on blocks", str(spec.recycle_on_blocks or "never")),
        ("  Max surge", str(spec.max_surge)),
    ]


def members_table(members: Sequence[Member], now: datetime) -> Table:
    out = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("NAME", "PROVIDER", "PHASE", "READY", "HEALTHY", "LEASED", "AGE", "NOTE"):
        out.add_column(column, no_wrap=column != "NOTE", overflow="fold")
    for m in members:
        state = m.state
        note = []
        if m.planned.retired_at is not None:
            note.append("retired, being removed")
        if not state.declared:
            note.append("not declared yet")
        if state.rotating:
            note.append("rotating")
        if m.proxy is not None and m.proxy.message and not state.ready:
            note.append(m.proxy.message)
        out.add_row(
            inert(m.planned.member.name),
            inert(m.planned.member.provider),
            inert(state.phase or "-"),
            _yes(state.ready),
            _yes(state.healthy),
            _yes(state.leased),
            age(state.since, now),
            inert("; ".join(note) or "-"),
        )
    return out


def decisions_table(decisions: Sequence[Decided]) -> Table:
    out = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("TIME", "GEN", "REASON", "MESSAGE", "SAW"):
        out.add_column(column, no_wrap=column not in ("MESSAGE", "SAW"), overflow="fold")
    for decided in decisions:
        event = decided.event
        seen = event.figures
        out.add_row(
            format_time(decided.at),
            str(event.generation),
            inert(event.reason),
            inert(event.message or "-"),
            f"{seen.members}/{seen.desired} members, {seen.ready} ready, {seen.leased} leased",
        )
    return out


def describe(row: PoolRow, decisions: Sequence[Decided], now: datetime) -> RenderableType:
    """``describe pool``: what it asks for, its members now, and why it did what it did."""
    view = row.view
    created = "-"
    if view.created_at is not None:
        created = f"{format_time(view.created_at)} ({age(view.created_at, now)} ago)"
    parts: list[RenderableType] = [
        _fields(
            [
                ("Name", view.name),
                ("Namespace", view.namespace),
                ("UID", view.uid),
                ("Status", status(view)),
                ("Generation", str(view.generation)),
                ("Source", view.source or "-"),
                ("Created", created),
                ("Figures", _figures(row.figures)),
            ]
        ),
        Text("Spec:", style="bold"),
        _fields(_spec(row)),
        Text("Members:", style="bold"),
        Padding(members_table(row.members, now), (0, 0, 0, 2))
        if row.members
        else Text("  none yet"),
    ]
    last = view.last_decision
    parts.append(Text("Last decision:", style="bold"))
    if last is None:
        parts.append(Text("  none yet (is the pool controller running? `run pools` or `up`)"))
    else:
        at = format_time(view.decided_at) if view.decided_at is not None else "-"
        parts.append(
            _fields(
                [
                    ("  Reason", last.reason),
                    ("  Message", last.message or "-"),
                    ("  Time", at),
                    ("  Saw", _figures(last.figures)),
                ]
            )
        )
    if decisions:
        shown = decisions[-DECISIONS_SHOWN:]
        parts.append(Text(f"Decisions (last {len(shown)} of {len(decisions)}):", style="bold"))
        parts.append(Padding(decisions_table(shown), (0, 0, 0, 2)))
    return Group(*parts)
