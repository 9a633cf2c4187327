"""Errors of the model store: unsafe names and paths, refused imports and pulls, bad or unfinished variants,
failed downloads and quantizations, cancelled jobs."""

from __future__ import annotations

from appliance.errors import ApplianceError, BadRequest, Conflict, PermissionDenied


class UnsafePath(BadRequest):
    """A path would leave the model store or pass through a symlink."""

    code = "unsafe_path"


class RefusedImport(BadRequest):
    """The file or folder is not something the appliance will import."""

    code = "import_refused"


class ModelCorrupt(Conflict):
    """The variant failed verification (or its files changed); it will not be loaded."""

    code = "model_corrupt"


class ModelNotReady(Conflict):
    """The variant is still being installed."""

    code = "model_not_ready"


class ModelNotDownloaded(ModelNotReady):
    """The variant is known on the hub (``available``) but not downloaded: pull it first."""

    code = "model_not_downloaded"


class PullNotAllowed(PermissionDenied):
    """The URL's scheme or host may not be pulled from (SSRF defence)."""

    code = "pull_not_allowed"


class UpstreamError(ApplianceError):
    """The server we download from failed or answered with an error."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class ChecksumMismatch(BadRequest):
    """The downloaded bytes do not have the expected sha256."""

    code = "checksum_mismatch"


class RetryableDownloadError(Exception):
    """A connection-level failure worth resuming from (never reaches a client)."""


class QuantizeFailed(ApplianceError):
    """libllama's quantizer failed."""

    status = 500
    code = "quantize_failed"


class JobCancelled(ApplianceError):
    """The job was cancelled by an admin."""

    status = 409
    type = "invalid_request_error"
    code = "cancelled"


class HubAccessDenied(UpstreamError):
    """The hub refused to list or serve a repository: it is gated or private, and the token is missing or wrong."""

    code = "hub_access_denied"


class Offline(PermissionDenied):
    """The appliance is set ``offline = true``: nothing reaches out, so pulls are refused."""

    code = "offline"


class StoreReadOnly(PermissionDenied):
    """The model store is set ``store_read_only = true``: nothing is written to its folder."""

    code = "store_read_only"
