"""The bundle commands install.sh runs with the system's Python (``PYTHONPATH=<sources> python3 -m appliance.release``).

make FILE [--version-suffix S] [--no-debs] [--wheels-from BUNDLE]
                                             make a bundle from these sources (install.sh --make-bundle); with
                                             --wheels-from, the dependencies come from an earlier bundle (no network)
verify FILE                                  check a bundle and say what it holds; exit 2 with the reason if refused
install FILE --prefix DIR [--no-debs]        verify, unpack into DIR/releases/<version>, build its venv, make it current
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from appliance.release import archive, make, releases
from appliance.release.manifest import BundleRefused, verify

SOURCES = Path(__file__).resolve().parents[2]


def _verify_only(bundle: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="appliance-bundle-"))
    try:
        archive.unpack(bundle, folder)
        manifest = verify(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"{bundle}: appliance {manifest.version}, {manifest.flavour} engine, for {manifest.platform.describe()}, "
        f"built {manifest.built_at} (build {manifest.build_id}); {len(manifest.members)} members verified"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m appliance.release", description="Make, verify and install bundles.")
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("make")
    made.add_argument("file", type=Path)
    made.add_argument("--version-suffix", default="", help="appended to the version (PEP 440), e.g. .post1")
    made.add_argument("--no-debs", action="store_true")
    made.add_argument("--wheels-from", type=Path, help="an earlier bundle whose dependency wheels, engine and debs to reuse")
    checked = commands.add_parser("verify")
    checked.add_argument("file", type=Path)
    installed = commands.add_parser("install")
    installed.add_argument("file", type=Path)
    installed.add_argument("--prefix", type=Path, required=True)
    installed.add_argument("--no-debs", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "make":
            make.make(SOURCES, args.file, args.version_suffix, with_debs=not args.no_debs, wheels_from=args.wheels_from)
        elif args.command == "verify":
            _verify_only(args.file)
        else:
            manifest = releases.install(args.file, releases.Layout(args.prefix.resolve()), debs=not args.no_debs)
            print(f"appliance {manifest.version} is the current release in {args.prefix}")
    except BundleRefused as exc:
        print(f"bundle refused: {exc.reason}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
