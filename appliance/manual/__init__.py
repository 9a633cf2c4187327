"""The manual that ships in the box.

``config_reference`` writes the configuration reference page (``docs/configuration-reference.md``)
from the settings model; ``site`` finds the built manual (mkdocs' output, installed as package data
in ``appliance/webui/manual``) and answers the file a ``/docs`` path names, never one outside it.
Imports ``appliance.settings`` and the standard library only; the HTTP route is ``appliance.api.manual``.
"""
