"""Each store safety test, seen failing against a deliberately broken build (the reliability table's rule).

Copies the working tree to a temporary folder, applies one break at a time there
(never in the checkout), runs the safety tests meant to catch it, and prints
their result; every line should say "failed".

    python tests/security/store_mutations.py [MUTATION_ID ...]
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
MUT = Path(tempfile.mkdtemp(prefix="store-mutants-"))
for part in ("appliance", "tests", "models", "drivers", "webui", "pyproject.toml"):
    if (SRC / part).is_dir():
        shutil.copytree(SRC / part, MUT / part, ignore=shutil.ignore_patterns("__pycache__"))
    elif (SRC / part).exists():
        shutil.copy2(SRC / part, MUT / part)
MUTATIONS = [
    # (id, file, old, new, tests)
    (
        "row4-names-unchecked",
        "appliance/store/paths.py",
        'NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")',
        'NAME_RE = re.compile(r"^.*$", re.S)',
        "tests/security/test_store_traversal.py",
    ),
    (
        "row4-no-containment-or-symlink-check",
        "appliance/store/paths.py",
        "        resolved = Path(os.path.realpath(candidate))\n",
        "        return Path(os.path.realpath(candidate))\n        resolved = Path(os.path.realpath(candidate))\n",
        "tests/security/test_store_traversal.py",
    ),
    (
        "row4-symlinked-import-source",
        "appliance/store/imports.py",
        '    if stat.S_ISLNK(mode):\n        raise RefusedImport("symlinks are refused; give the real path", param="path")',
        "    pass",
        "tests/security/test_store_traversal.py::test_import_refuses_a_symlinked_source",
    ),
    (
        "row5-template-rendered-on-import",
        "appliance/store/installs.py",
        "        out = facts.to_dict()\n",
        "        out = facts.to_dict()\n        import jinja2\n        jinja2.Environment().from_string(facts.chat_template or "
        '"").render(messages=[])\n',
        "tests/security/test_store_import_policy.py::test_hostile_chat_template_imports_flagged_and_unrendered",
    ),
    (
        "row5-template-in-list-view",
        "appliance/api/models.py",
        '_HEAVY_FACTS = ("chat_template",)',
        "_HEAVY_FACTS = ()",
        "tests/security/test_store_import_policy.py::test_hostile_chat_template_imports_flagged_and_unrendered",
    ),
    (
        "row6-no-inspection",
        "appliance/store/installs.py",
        '        facts = inspect_gguf(path) if fmt == "gguf" else inspect_hf(path)\n        out = facts.to_dict()\n        '
        'template = facts.chat_template or ""\n',
        '        return {"chat_template_flags": []}\n',
        "tests/security/test_store_import_policy.py -k hostile_gguf",
    ),
    (
        "row7-no-file-policy",
        "appliance/store/imports.py",
        "    suffix = rel.suffix.lower()\n    if suffix in PICKLE_OR_CODE:",
        "    suffix = rel.suffix.lower()\n    return None\n    if suffix in PICKLE_OR_CODE:",
        "tests/security/test_store_import_policy.py -k 'refused or auto_map'",
    ),
    (
        "row7-no-auto-map-check",
        "appliance/store/imports.py",
        '    if isinstance(data, dict) and "auto_map" in data:',
        "    if False:",
        "tests/security/test_store_import_policy.py -k auto_map",
    ),
    (
        "row9-no-address-check",
        "appliance/store/pull.py",
        "def _why_internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:\n",
        "def _why_internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:\n    return None\n",
        "tests/security/test_store_ssrf.py",
    ),
    (
        "row9-redirect-hops-unchecked",
        "appliance/store/download.py",
        "            target = check_url(url, self.allow)\n",
        "            from appliance.store.pull import Target\n            from urllib.parse import urlsplit\n            target "
        "= check_url(url, self.allow) if _hop == 0 else Target(url, urlsplit(url).netloc, None)\n",
        "tests/security/test_store_ssrf.py::test_redirects_to_internal_hosts_are_refused",
    ),
    (
        "row9-no-pinning",
        "appliance/store/pull.py",
        '    pinned = parts._replace(netloc=f"{shown}:{port}").geturl()\n',
        "    pinned = url\n",
        "tests/security/test_store_ssrf.py::test_the_connection_goes_to_the_checked_address",
    ),
    (
        "row15-no-resume",
        "appliance/store/download.py",
        '        if have and meta and meta.get("validator"):',
        "        if False:",
        "tests/security/test_store_integrity.py::test_kill_9_mid_download_then_resume",
    ),
    (
        "row15-verify-always-ok",
        "appliance/store/store.py",
        "            ok = digest is not None and size == info.size_bytes and (info.sha256 is None or digest == info.sha256)",
        "            ok = True",
        "tests/security/test_store_integrity.py::test_flipped_byte_is_marked_corrupt_and_never_resolved",
    ),
    (
        "row15-enospc-partial-kept",
        "appliance/store/download.py",
        "            remove_partial(self.partial)\n            raise InsufficientStorage(",
        "            raise InsufficientStorage(",
        "tests/security/test_store_integrity.py -k enospc",
    ),
    (
        "row15-enospc-retried",
        "appliance/store/download.py",
        "                except RetryableDownloadError as exc:",
        "                except (RetryableDownloadError, OSError) as exc:",
        "tests/security/test_store_integrity.py -k enospc",
    ),
]


def run(tests):
    cmd = f"cd {MUT} && PYTHONPATH={MUT} timeout 600 {sys.executable} -m pytest -q -p no:cacheprovider -x {tests} 2>&1 | tail -1"
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()


only = sys.argv[1:]
for mid, f, old, new, tests in MUTATIONS:
    if only and mid not in only:
        continue
    path = MUT / f
    orig = (SRC / f).read_text()
    assert orig.count(old) == 1, (mid, orig.count(old))
    path.write_text(orig.replace(old, new))
    broken = run(tests)
    path.write_text(orig)
    print(f"{mid:42s} broken build: {broken}", flush=True)
shutil.rmtree(MUT, ignore_errors=True)
