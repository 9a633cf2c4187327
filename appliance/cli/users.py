"""`appliancectl users create|passwd|unlock|initial-password`: console users, through the daemon's admin API."""

from __future__ import annotations

import sys

import click

from appliance.accounts.users import ROLES, password_problem
from appliance.cli.client import request


def _read_password(username: str, from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("New password", hide_input=True, confirmation_prompt=True)
    problem = password_problem(password, username)  # the daemon checks again; this saves a round trip
    if problem is not None:
        raise click.ClickException(problem)
    return password


def register(group: click.Group) -> None:
    @group.group()
    def users() -> None:
        """Console users: create, set passwords, clear sign-in throttling."""

    @users.command("create")
    @click.argument("username")
    @click.option("--role", type=click.Choice(ROLES), default="viewer", show_default=True)
    @click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin instead of a prompt.")
    @click.option("--must-change", is_flag=True, help="Make the user choose a new password at first sign-in.")
    @click.pass_context
    def create(ctx: click.Context, username: str, role: str, password_stdin: bool, must_change: bool) -> None:
        """Create a console user (the password must pass the policy: see the README)."""
        password = _read_password(username, password_stdin)
        body = {"username": username, "password": password, "role": role, "must_change_password": must_change}
        user = request(ctx, "POST", "/admin/users/", json=body)
        click.echo(f"Created console user {user['username']} (role {user['role']}).")

    @users.command("passwd")
    @click.argument("username")
    @click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin instead of a prompt.")
    @click.option("--must-change", is_flag=True, help="Make the user choose a new password at next sign-in.")
    @click.pass_context
    def passwd(ctx: click.Context, username: str, password_stdin: bool, must_change: bool) -> None:
        """Set a console user's password; their sessions end."""
        password = _read_password(username, password_stdin)
        done = request(
            ctx, "PUT", f"/admin/users/{username}/password", json={"password": password, "must_change_password": must_change}
        )
        click.echo(f"Password set for {done['username']}; {done['sessions_ended']} session(s) ended.")

    @users.command("initial-password")
    @click.pass_context
    def initial_password(ctx: click.Context) -> None:
        """Print the first admin's one-time password while it is still the one to sign in with.

        It is kept in <data dir>/initial-admin-password (mode 0600; root's after a system
        install, so run this with sudo there) until `admin` has chosen their own.
        """
        from appliance.cli.initial_password import password_file

        path = password_file(ctx.find_root().obj["settings"])
        try:
            password = path.read_text().strip()
        except FileNotFoundError:
            raise click.ClickException(
                f"no one-time password is pending ({path} does not exist): `admin` has chosen their own;"
                " `appliancectl users passwd admin` sets a new one"
            ) from None
        except PermissionError:
            raise click.ClickException(f"{path} is not readable by this user; run this command with sudo") from None
        click.echo(f"User `admin`, one-time password: {password}")
        click.echo("(It signs in until `admin` chooses their own password; the next daemon start then removes the file.)")

    @users.command("unlock")
    @click.argument("username")
    @click.option("--address", help="Also forget the failed sign-ins from this client address.")
    @click.pass_context
    def unlock(ctx: click.Context, username: str, address: str | None) -> None:
        """Clear the sign-in throttling for a console user (and optionally an address)."""
        done = request(ctx, "POST", f"/admin/users/{username}/unlock", json={"address": address})
        click.echo(f"Unlocked {done['username']}: {done['failures_forgotten']} recorded failure(s) forgotten.")
