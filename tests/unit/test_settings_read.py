"""Every setting of the configuration reference is read by product code.

A setting counts as read when some product module (outside ``appliance/settings/``,
where the fields are only declared) reads it from a settings object: an attribute
load ``<settings>.<field>`` or a ``getattr(<settings>, "<field>")``, where the
receiver is a name or attribute called ``settings`` or ``*_settings``
(``settings``, ``self.settings``, ``self._settings``). A mention in a docstring,
a comment, a string elsewhere or the same attribute name on another object
(``request.client.host``) does not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

from appliance.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("appliance", "drivers", "webui", "models", "systemd")
DECLARATION = ROOT / "appliance" / "settings"

#: Settings that nothing reads yet, each with what is missing. An entry must go once the setting is read.
KNOWN_UNWIRED: dict[str, str] = {}


def _is_settings(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "settings" or name.endswith("_settings")


def reads_in(source: str) -> set[str]:
    """Names read from a settings object in one module's source."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _is_settings(node.value):
            found.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and _is_settings(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            found.add(node.args[1].value)
    return found


def product_reads() -> set[str]:
    found: set[str] = set()
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if DECLARATION not in path.parents:
                found |= reads_in(path.read_text())
    return found


def test_the_scanner_counts_reads_from_settings_objects_only():
    source = '''
"""Uses settings.queue_size and `.drain_timeout_seconds`."""
def f(settings, request, self):
    request.client.host
    settings.port
    self._settings.cache_ttl_seconds
    getattr(settings, "vllm_python", None)
    getattr(request, "log_level")
    settings.backend = "vllm"
    print("max_connections")
'''
    assert reads_in(source) == {"port", "cache_ttl_seconds", "vllm_python"}


def test_every_setting_is_read_by_product_code():
    unread = set(Settings.model_fields) - product_reads() - set(KNOWN_UNWIRED)
    assert not unread, f"settings that no product code reads: {sorted(unread)}"


def test_the_list_of_unwired_settings_is_not_stale():
    assert set(KNOWN_UNWIRED) <= set(Settings.model_fields), "KNOWN_UNWIRED names a setting that does not exist"
    now_read = set(KNOWN_UNWIRED) & product_reads()
    assert not now_read, f"these settings are read now; remove them from KNOWN_UNWIRED: {sorted(now_read)}"
