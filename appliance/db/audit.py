"""The audit trail: who did what to which thing, one row per admin action; and reading it back by filter.

Reading is newest first in a stable order (the row id, which only grows), a page at a time: a page ends with
the id to continue after, so rows written meanwhile never shift or repeat what the next page shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.engine import Engine
from sqlmodel import col

from appliance.db.engine import session
from appliance.db.tables import AuditLog

CHOICES_LIMIT = 500  # distinct actors or actions offered as filter choices


class AuditTrail:
    """Writes ``audit_log`` rows; actors are ``key:<prefix>``, ``user:<name>``, ``local-admin`` or ``system``."""

    def __init__(self, db: Engine):
        self._db = db

    def record(self, actor: str, action: str, target: str | None = None, detail: str | None = None) -> None:
        with session(self._db) as s:
            s.add(AuditLog(actor=actor, action=action, target=target, detail=detail))
            s.commit()


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which rows to read. ``since`` and ``until`` bound ``created_at`` as ``[since, until)``; ``actor`` is matched
    exactly; ``action`` exactly or as a group (``key`` matches ``key.create`` and ``key.revoke``); ``text`` anywhere
    in the actor, action, target or detail, as written (LIKE's wildcards in it match themselves)."""

    since: float | None = None
    until: float | None = None
    actor: str | None = None
    action: str | None = None
    text: str | None = None

    def clauses(self) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        if self.since is not None:
            out.append(col(AuditLog.created_at) >= self.since)
        if self.until is not None:
            out.append(col(AuditLog.created_at) < self.until)
        if self.actor:
            out.append(col(AuditLog.actor) == self.actor)
        if self.action:
            action = col(AuditLog.action)
            out.append(or_(action == self.action, action.startswith(self.action + ".", autoescape=True)))
        if self.text:
            columns = (AuditLog.actor, AuditLog.action, AuditLog.target, AuditLog.detail)
            out.append(or_(*(col(column).contains(self.text, autoescape=True) for column in columns)))
        return out


@dataclass(frozen=True, slots=True)
class AuditPage:
    rows: list[AuditLog]
    has_more: bool

    @property
    def next_after(self) -> int | None:
        """The id to read the next (older) page after, when there is one."""
        return self.rows[-1].id if self.has_more and self.rows else None


def read_page(db: Engine, filters: AuditFilter, *, after: int | None = None, limit: int = 100) -> AuditPage:
    """One page of matching rows, newest first, older than the row ``after`` when given."""
    query = select(AuditLog).where(*filters.clauses()).order_by(col(AuditLog.id).desc()).limit(limit + 1)
    if after is not None:
        query = query.where(col(AuditLog.id) < after)
    with session(db) as s:
        rows = list(s.execute(query).scalars())
    return AuditPage(rows[:limit], len(rows) > limit)


def iter_rows(db: Engine, filters: AuditFilter, *, batch: int = 500) -> Iterator[AuditLog]:
    """Every matching row, newest first, read a page at a time (no session stays open between pages)."""
    after: int | None = None
    while True:
        page = read_page(db, filters, after=after, limit=batch)
        yield from page.rows
        if page.next_after is None:
            return
        after = page.next_after


def filter_choices(db: Engine) -> tuple[list[str], list[str]]:
    """The actors and the actions the trail holds, for a filter's choices (each list bounded)."""
    with session(db) as s:
        actor, action = col(AuditLog.actor), col(AuditLog.action)
        actors = s.execute(select(actor).distinct().order_by(actor).limit(CHOICES_LIMIT)).scalars()
        actions = s.execute(select(action).distinct().order_by(action).limit(CHOICES_LIMIT)).scalars()
        return list(actors), list(actions)
