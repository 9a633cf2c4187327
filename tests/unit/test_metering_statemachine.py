"""A hypothesis state machine over admit / settle / fail / revoke / time passing.

The model predicts every admission decision from its own bookkeeping; after
every step the database must agree with it, and:

* spent + reserved <= limit on every counter (requests finish within their estimate);
* reserved equals what the ``reservations`` rows hold;
* ledger sum == counters: the usage rows of each window add up to its ``spent``.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from appliance.errors import RateLimited
from appliance.metering.meter import Meter
from appliance.metering.quotas import DIMENSIONS, Windows
from tests.meterkit import Clock, add_key, add_team, new_db, set_price, set_quota
from tests.meterkit import settings as make_settings

PRICE_OUT = 2.0  # per 1M; input 1.0, so an estimate at 2.0 bounds any real cost
DIM = {d.name: d for d in DIMENSIONS}
ROUNDING = 1e-12  # float noise allowed at a limit's exact boundary (limits here are >= 1e-4)
UNIT_SQL = {
    "requests": "count(*)",
    "tokens": "coalesce(sum(prompt_tokens + completion_tokens), 0)",
    "cost": "coalesce(sum(cost), 0)",
}


class MeteringMachine(RuleBasedStateMachine):
    admitted = Bundle("admitted")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="meter-sm-"))
        self.db = new_db(self.dir / "a.db")
        self.clock = Clock()
        self.loop = asyncio.new_event_loop()
        self.meter = Meter(make_settings(self.dir), self.db, clock=self.clock)
        self.loop.run_until_complete(self.meter.start())
        self.windows = Windows()
        self.team = add_team(self.db, "t")
        self.keys = [add_key(self.db, "a", self.team), add_key(self.db, "b", self.team)]
        set_price(self.db, "*", input_per_m=1.0, output_per_m=PRICE_OUT)
        self.limits: dict[tuple[str, int], dict[str, float]] = {}
        self.model: dict[tuple, list[float]] = {}  # (subject, id, dim, window_start) -> [spent, reserved]
        self.live: dict[str, list[tuple[tuple, float]]] = {}  # request id -> holds still reserved
        self.dead: set[str] = set()  # in flight when the daemon "crashed": they never finish
        self.n = 0
        self.reader = sqlite3.connect(self.db.url.database)

    def teardown(self) -> None:
        self.reader.close()
        self.loop.run_until_complete(self.meter.stop())
        self.meter.close()
        self.loop.close()
        self.db.dispose()

    @initialize(
        key_rpm=st.none() | st.integers(1, 6),
        key_tpd=st.none() | st.integers(0, 1500),
        key_conc=st.none() | st.integers(1, 4),
        team_tpm=st.none() | st.integers(100, 2000),
        team_cost=st.none() | st.sampled_from([0.0005, 0.001, 0.003]),
    )
    def quotas(self, key_rpm, key_tpd, key_conc, team_tpm, team_cost):
        key_limits = {
            k: v
            for k, v in (("requests_per_minute", key_rpm), ("tokens_per_day", key_tpd), ("max_concurrent", key_conc))
            if v is not None
        }
        team_limits = {k: v for k, v in (("tokens_per_minute", team_tpm), ("cost_per_month", team_cost)) if v is not None}
        if key_limits:
            set_quota(self.db, "key", self.keys[0].id, **key_limits)
            self.limits[("key", self.keys[0].id)] = key_limits
        if team_limits:
            set_quota(self.db, "team", self.team, **team_limits)
            self.limits[("team", self.team)] = team_limits

    # -- the model's prediction ------------------------------------------------------------
    def _plan(self, principal, estimate):
        plan = []
        for subject, sid in (("key", principal.id), ("team", principal.team_id)):
            for name, limit in self.limits.get((subject, sid), {}).items():
                dim = DIM[name]
                amount = {"requests": 1.0, "concurrent": 1.0, "tokens": float(estimate), "cost": estimate * PRICE_OUT / 1e6}[
                    dim.unit
                ]
                start, _ = self.windows.bounds(dim.window, self.clock())
                plan.append(((subject, sid, name, start), amount, limit))
        return plan

    @rule(target=admitted, who=st.integers(0, 1), estimate=st.integers(0, 600))
    def admit(self, who, estimate):
        principal = self.keys[who]
        plan = self._plan(principal, estimate)
        # Room left on each counter after this admission. Costs are floats that the database
        # and the model add up in different orders, so a request that lands exactly on a cost
        # limit may come out a rounding error either side of it: inside that band either
        # decision is right; outside it the meter must decide as the model does.
        rooms = [limit - (sum(self.model.get(k, [0, 0])) + amount) for k, amount, limit in plan if amount != 0]
        fits = all(room >= -ROUNDING for room in rooms)
        clear = all(room > ROUNDING for room in rooms)
        self.n += 1
        rid = f"r{self.n}"
        try:
            admission = self.meter.admit_now(principal, request_id=rid, endpoint="chat", model="m", estimated_tokens=estimate)
        except RateLimited:
            assert not clear, "refused although every counter had room"
            return None
        assert fits, "admitted past a limit"
        for k, amount, _ in plan:
            self.model.setdefault(k, [0.0, 0.0])[1] += amount
        if plan:  # an admission with nothing to hold writes no reservation
            self.live[rid] = [(k, amount) for k, amount, _ in plan]
        return (admission, plan)

    def _finish(self, item, tokens, cost):
        admission, plan = item
        held = dict(self.live.pop(admission.request_id, []))
        for k, _amount, _ in plan:
            unit = DIM[k[2]].unit
            real = {"requests": 1.0, "tokens": float(tokens), "cost": cost, "concurrent": 0.0}[unit]
            entry = self.model[k]
            entry[0] += real
            entry[1] -= held.get(k, 0.0)

    def _gone(self, item) -> bool:
        return item is None or item[0].request_id in self.dead

    @rule(item=consumes(admitted), fraction=st.floats(0, 1))
    def settle(self, item, fraction):
        if self._gone(item):
            return
        admission, _ = item
        total = math.floor(admission.estimated_tokens * fraction)
        prompt, completion = total // 2, total - total // 2
        cost = self.loop.run_until_complete(
            self.meter.settle(
                admission,
                model="m",
                variant=None,
                backend="x",
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=0,
                ttft_ms=1.0,
                latency_ms=2.0,
                status=200,
            )
        )
        assert cost == pytest.approx((prompt * 1.0 + completion * PRICE_OUT) / 1e6)
        self._finish(item, total, cost)

    @rule(item=consumes(admitted), fraction=st.floats(0, 1), status=st.sampled_from([499, 503]))
    def fail(self, item, fraction, status):
        if self._gone(item):
            return
        admission, _ = item
        completion = math.floor(admission.estimated_tokens * fraction)
        self.loop.run_until_complete(self.meter.release(admission, status=status, model="m", completion_tokens=completion))
        self._finish(item, completion, completion * PRICE_OUT / 1e6)

    @rule()
    def revoke(self):
        """The daemon dies with requests in flight; the next start revokes their reservations.

        (A request that outlives its revoked reservation is covered in test_quotas.)"""
        released = self.meter.release_stale(older_than_s=-1)
        assert released == len(self.live)
        for holds in self.live.values():
            for k, amount in holds:
                self.model[k][1] -= amount
        self.dead.update(self.live)
        self.live.clear()

    @rule(seconds=st.sampled_from([1, 29, 60, 3600, 86400, 31 * 86400]))
    def time_passes(self, seconds):
        self.clock.advance(seconds)

    # -- invariants --------------------------------------------------------------------
    def _rows(self, sql, *args):
        return self.reader.execute(sql, args).fetchall()

    def _counters(self):
        return self._rows(
            "SELECT id, subject_type, subject_id, dimension, window_start, limit_value, spent, reserved FROM quota_counters"
        )

    @invariant()
    def database_agrees_with_the_model(self):
        for _, subject, sid, dim, start, _, spent, reserved in self._counters():
            want_spent, want_reserved = self.model.get((subject, sid, dim, start), [0.0, 0.0])
            assert spent == pytest.approx(want_spent, abs=1e-12)
            assert reserved == pytest.approx(want_reserved, abs=1e-12)

    @invariant()
    def never_over_the_limit(self):
        for *_, limit, spent, reserved in self._counters():
            assert spent + reserved <= limit + 1e-12

    @invariant()
    def reserved_is_what_reservations_hold(self):
        held: dict[int, float] = {}
        for (counters,) in self._rows("SELECT counters FROM reservations"):
            for cid, amount in json.loads(counters):
                held[cid] = held.get(cid, 0.0) + amount
        for cid, *_, reserved in self._counters():
            assert reserved == pytest.approx(held.get(cid, 0.0), abs=1e-12)

    @invariant()
    def ledger_sum_equals_counters(self):
        for _, subject, sid, dim, start, _, spent, _ in self._counters():
            d = DIM[dim]
            if d.unit == "concurrent":
                assert spent == 0
                continue
            _, end = self.windows.bounds(d.window, start)
            column = "key_id" if subject == "key" else "team_id"
            ((total,),) = self._rows(
                f"SELECT {UNIT_SQL[d.unit]} FROM usage WHERE {column} = ? AND created_at >= ? AND created_at < ?", sid, start, end
            )
            assert total == pytest.approx(spent, abs=1e-12)


MeteringMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestMetering = MeteringMachine.TestCase
