"""The console's rules behind its buttons, in-process against a migrated database: deleting users and teams
(self, last admin, a team with keys), cancelling and clearing jobs, the keys table's spend, and errors that
name what went wrong for the control that caused them."""

from __future__ import annotations

import re
import threading
import time

import pytest
from litestar.testing import TestClient
from sqlalchemy import select, text

from appliance.accounts.users import create_user
from appliance.app import create_app
from appliance.db import engine as dbmod
from appliance.db.tables import Usage, User
from appliance.metering.reports import query_usage
from appliance.services import Services
from appliance.settings import Settings
from appliance.webui.key_table import month_start

PASSWORDS = {"alice": "alice-password-1", "bob": "bob-password-1", "otto": "otto-password-1"}


@pytest.fixture
def services(tmp_path):
    settings = Settings(data_dir=tmp_path, seed_default_model=False, currency="EUR")
    dbmod.migrate(settings.db_path)
    services = Services(settings)
    for name, role in (("alice", "admin"), ("bob", "admin"), ("otto", "operator")):
        create_user(services.db, name, PASSWORDS[name], role=role)
    yield services
    services.jobs.shutdown(2)
    services.db.dispose()


class Console:
    """A signed-in console client that sends htmx requests with the session's CSRF token."""

    def __init__(self, app, user: str, *, runs_lifespan: bool):
        self.client = TestClient(app, base_url="http://testserver.local")
        self.runs_lifespan = runs_lifespan
        if runs_lifespan:  # one client per app runs its start-up and shut-down; the others share that app
            self.client.__enter__()
        token = re.search(r'name="csrf_token" value="([^"]+)"', self.client.get("/login").text).group(1)
        assert (
            self.client.post(
                "/login", data={"username": user, "password": PASSWORDS[user], "csrf_token": token}, follow_redirects=False
            ).status_code
            == 303
        )
        self.token = re.search(r'"X-CSRF-Token": "([^"]+)"', self.client.get("/").text).group(1)

    def post(self, path: str, **data: str):
        return self.client.post(path, data=data, headers={"X-CSRF-Token": self.token, "HX-Request": "true"})

    def close(self) -> None:
        if self.runs_lifespan:
            self.client.__exit__(None, None, None)


@pytest.fixture
def console(services):
    app = create_app(services.settings, services=services)
    made: list[Console] = []

    def sign_in(user: str = "alice") -> Console:
        made.append(Console(app, user, runs_lifespan=not made))
        return made[-1]

    yield sign_in
    for c in reversed(made):
        c.close()


def _user_id(services, name: str) -> int | None:
    with dbmod.session(services.db) as s:
        row = s.execute(select(User).where(User.username == name)).scalars().first()
        return row.id if row else None


def _audit(services, action: str) -> list[tuple[str, str, str | None]]:
    with services.db.connect() as conn:
        return [
            tuple(r) for r in conn.execute(text("SELECT actor, target, detail FROM audit_log WHERE action = :a"), {"a": action})
        ]


def test_deleting_a_user_ends_their_sessions_and_is_audited_but_never_oneself(services, console):
    alice, bob = console("alice"), console("bob")
    refused = alice.post(f"/users/{_user_id(services, 'alice')}/delete")
    assert refused.status_code == 409 and "You cannot delete yourself; ask another admin." in refused.text
    assert 'role="alert"' in refused.text
    assert _user_id(services, "alice") is not None

    done = alice.post(f"/users/{_user_id(services, 'bob')}/delete")
    assert done.status_code == 200 and "bob deleted; their sessions ended." in done.text
    assert 'data-user="bob"' not in done.text
    assert _user_id(services, "bob") is None
    assert _audit(services, "user.delete") == [("user:alice", "bob", "role=admin sessions_ended=1")]
    assert bob.client.get("/keys", follow_redirects=False).status_code == 303  # bob's session is gone
    # alice is the only admin now; an operator's stale page cannot reach the rule (admins only), and the
    # rule itself is the one tests/unit/test_console_user_rules.py drives
    assert console("otto").post(f"/users/{_user_id(services, 'alice')}/delete").status_code == 403


def test_a_team_with_keys_is_refused_with_a_reason_then_deleted(services, console):
    alice = console("alice")
    alice.post("/teams/create", name="research")
    team_id = services.quotas.list_teams()[0]["id"]
    key, _secret = services.keyring.create("svc", team_id=team_id)
    refused = alice.post("/teams/research/delete")
    assert refused.status_code == 409
    assert "Team research still has 1 active key; revoke them or move them to another team first." in refused.text
    alice.post(f"/keys/{key.id}/revoke")
    done = alice.post("/teams/research/delete")
    assert done.status_code == 200 and "Team research deleted" in done.text and 'data-team="research"' not in done.text
    assert [r[:2] for r in _audit(services, "team.delete")] == [("user:alice", "team:research")]
    assert alice.post("/teams/research/delete").status_code == 404


def test_a_running_job_is_cancelled_and_finished_ones_are_cleared(services, console):
    alice = console("alice")
    started, honour = threading.Event(), threading.Event()

    def slow(ctx):
        started.set()
        while True:
            if honour.is_set():  # the work notices the cancel only when the test says so
                ctx.check_cancelled()
            time.sleep(0.05)

    running = services.jobs.submit("pull", "slow:q4", slow)
    finished = services.jobs.submit("import", "quick:f16", lambda ctx: {"ok": True})
    assert started.wait(5) and finished.wait(5)
    page = alice.client.get("/models").text
    assert f'data-testid="cancel-job-{running.id}"' in page and f'data-testid="cancel-job-{finished.id}"' not in page
    assert console("otto").post(f"/jobs/{running.id}/cancel").status_code == 403  # operators do not start pulls either
    answer = alice.post(f"/jobs/{running.id}/cancel")
    assert answer.status_code == 200 and "Cancelling the pull of slow:q4" in answer.text
    assert (
        "data-feedback" not in answer.text and "<form" not in answer.text
    )  # only the acknowledgement, for the card's live region
    page = alice.client.get("/models").text
    assert f'id="job-{running.id}-feedback" role="status" aria-live="polite"' in page
    again = alice.post(f"/jobs/{running.id}/cancel")  # a second click while the job still runs: same answer, audited once
    assert again.status_code == 200 and "Cancelling the pull of slow:q4" in again.text and not running.finished
    honour.set()
    assert running.wait(5) and running.state == "cancelled"
    assert "The pull of slow:q4 had already ended." in alice.post(f"/jobs/{running.id}/cancel").text
    assert [r[:2] for r in _audit(services, "job.cancel")] == [("user:alice", "slow:q4")]
    cleared = alice.post("/jobs/clear")
    assert cleared.status_code == 200 and "Cleared 2 finished jobs from the list." in cleared.text
    assert services.jobs.list() == []
    with services.db.connect() as conn:  # the history stays in the jobs table
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 2
    assert "No finished jobs to clear." in alice.post("/jobs/clear").text


def test_the_keys_table_shows_limits_and_this_months_spend_as_the_usage_report_does(services, console):
    alice = console("alice")
    key, _secret = services.keyring.create("billing")
    other, _ = services.keyring.create("other")
    services.quotas.set_quota(f"key:{key.id}", {"tokens_per_month": 10_000, "cost_per_month": 5}, "user:alice")
    now = time.time()
    with dbmod.session(services.db) as s:
        for i, (k, when, prompt, completion, cost) in enumerate(
            [
                (key.id, now - 60, 100, 50, 0.25),
                (key.id, now - 120, 10, 5, 0.125),
                (key.id, month_start(now) - 3600, 1000, 1000, 9.0),  # last month: not in this month's figures
                (other.id, now - 30, 7, 7, 0.5),
            ]
        ):
            s.add(
                Usage(
                    request_id=f"r{i}",
                    created_at=when,
                    key_id=k,
                    endpoint="chat",
                    model="m:q",
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cost=cost,
                )
            )
        s.commit()
    html = alice.client.get("/keys").text
    cell = re.search(
        rf'<tr data-key="{key.prefix}">.*?data-testid="spend" data-tokens="(\d+)" data-cost="([\d.]+)">(.*?)</td>', html, re.S
    )
    report = {r["key_id"]: r for r in query_usage(services.db, since=month_start(now), by=("key",))["rows"]}
    assert int(cell.group(1)) == report[key.id]["total_tokens"] == 165
    assert float(cell.group(2)) == pytest.approx(report[key.id]["cost"]) == pytest.approx(0.375)
    assert "0.3750 EUR" in cell.group(3) and "10.0k left" in cell.group(3) and "5.00 left" in cell.group(3)
    assert "tokens per month 10,000 · 0 used" in html and "cost per month 5.00 EUR" in html and "Costs are in EUR" in html
