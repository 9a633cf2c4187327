"""What the store's settings and a variant's state refuse, with the message that tells the user what to do instead.

A read-only store (``store_read_only``) is never written and is the only kind that is scanned; an offline appliance
(``offline``) makes no outbound request, so it pulls nothing; a variant only listed on the hub has no files yet.
"""

from __future__ import annotations

from appliance.errors import Conflict
from appliance.store.errors import ModelNotDownloaded, Offline, StoreReadOnly
from appliance.store.variants import VariantInfo


def refuse_writes(read_only: bool, param: str) -> None:
    """StoreReadOnly when the store is read-only."""
    if read_only:
        raise StoreReadOnly(
            "the model store is read-only (setting store_read_only = true): the appliance never writes "
            "there; add or remove model files in the folder itself, then rescan",
            param=param,
        )


def refuse_offline(offline: bool) -> None:
    """Offline when the appliance may make no outbound request."""
    if offline:
        raise Offline(
            "the appliance is offline (setting offline = true): it makes no outbound request, so models "
            "cannot be pulled; import a file, a folder or an offline bundle instead",
            param="url",
        )


def check_scannable(read_only: bool) -> None:
    """Conflict unless the store is read-only: only such a store is scanned for models."""
    if not read_only:
        raise Conflict(
            "only a read-only store (setting store_read_only = true) is scanned; install models by pull or import",
            code="store_writable",
        )


def check_downloaded(info: VariantInfo) -> None:
    """ModelNotDownloaded for a variant only listed on the hub (``available``): it has no files yet."""
    if info.available:
        raise ModelNotDownloaded(
            f"The model `{info.name}` is available on the hub but not downloaded; pull it first "
            f"(appliancectl models pull {info.name}).",
            param="model",
        )
