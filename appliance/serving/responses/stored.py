"""Responses kept for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``.

A stored response belongs to the key that created it: for any other key it does
not exist (404, never 403, so ids cannot be probed), and past its expiry it does
not exist for anyone. Expired rows are purged by the scheduler.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from sqlalchemy import ColumnElement, delete
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from appliance.accounts.keys import Principal
from appliance.db.engine import session
from appliance.db.tables import StoredResponse
from appliance.errors import NotFound
from appliance.jsontypes import JsonObject
from appliance.settings import Settings


@dataclass(frozen=True)
class Conversation:
    """A stored response as the next turn needs it: the items answered, and the response object."""

    items: list[JsonObject]
    response: JsonObject

    def continued(self) -> list[JsonObject]:
        """The conversation a follow-up continues: the items answered, then the answer's output."""
        return self.items + self.response.get("output", [])


def not_found(response_id: str) -> NotFound:
    return NotFound(
        f"No response with id `{response_id}` (it may have expired or been stored with `store: false`).",
        param="previous_response_id",
        code="response_not_found",
    )


class ResponseStore:
    def __init__(self, settings: Settings, db: Engine):
        self._settings = settings
        self._db = db

    def _ttl_seconds(self) -> float:
        return self._settings.responses_ttl_hours * 3600

    # ------------------------------------------------------------ writes
    def save(self, principal: Principal, items: list[JsonObject], response: JsonObject) -> None:
        created = time.time()
        row = StoredResponse(
            id=response["id"],
            key_id=principal.id,
            model=response.get("model") or "",
            conversation=json.dumps(items, ensure_ascii=False),
            response=json.dumps(response, ensure_ascii=False),
            created_at=created,
            expires_at=created + self._ttl_seconds(),
        )
        with session(self._db) as s:
            s.add(row)
            s.commit()

    async def save_async(self, principal: Principal, items: list[JsonObject], response: JsonObject) -> None:
        await asyncio.to_thread(self.save, principal, items, response)

    def delete(self, principal: Principal, response_id: str) -> None:
        with session(self._db) as s:
            result = s.execute(
                delete(StoredResponse).where(
                    col(StoredResponse.id) == response_id, _owned_by(principal), col(StoredResponse.expires_at) > time.time()
                )
            )
            s.commit()
        if not result.rowcount:  # type: ignore[attr-defined]
            raise not_found(response_id)

    async def delete_async(self, principal: Principal, response_id: str) -> None:
        await asyncio.to_thread(self.delete, principal, response_id)

    def purge_expired(self) -> int:
        """Delete every expired response; returns how many."""
        with session(self._db) as s:
            result = s.execute(delete(StoredResponse).where(StoredResponse.expires_at <= time.time()))  # type: ignore[arg-type]
            s.commit()
        return int(result.rowcount or 0)  # type: ignore[attr-defined]

    # ------------------------------------------------------------- reads
    def load(self, principal: Principal, response_id: str) -> Conversation:
        """The stored response ``response_id`` of ``principal``'s key; :class:`NotFound` if missing, another key's or expired."""
        with session(self._db) as s:
            row = s.exec(
                select(StoredResponse).where(
                    StoredResponse.id == response_id, _owned_by(principal), StoredResponse.expires_at > time.time()
                )
            ).first()
        if row is None:
            raise not_found(response_id)
        return Conversation(items=json.loads(row.conversation), response=json.loads(row.response))

    async def load_async(self, principal: Principal, response_id: str) -> Conversation:
        return await asyncio.to_thread(self.load, principal, response_id)


def _owned_by(principal: Principal) -> ColumnElement[bool]:
    """Rows of the caller's key (the local admin socket, which has no key, owns the rows without one)."""
    column = StoredResponse.key_id
    return column.is_(None) if principal.id is None else column == principal.id  # type: ignore[union-attr,return-value]
