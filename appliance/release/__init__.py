"""Release bundles: one archive that installs or upgrades a box with no network access.

``manifest`` (what a bundle holds and the checks that refuse a bundle: every member's sha256 and size, the
operating system, CPU architecture and Python it was made for), ``archive`` (packing a folder into the
archive and unpacking one safely), ``make`` (``install.sh --make-bundle``: wheels, Debian packages, sources
and the manifest, made on a connected machine), ``releases`` (``/opt/appliance/releases/<version>``: a
verified bundle unpacked beside the running release, its venv built from the bundle's wheels alone, and the
``current`` link switched in one rename) and ``__main__`` (the commands install.sh runs).

Standard library only: install.sh runs these modules with the system's Python before any venv exists.
Imports nothing of the appliance.
"""
