"""Why a hardware library cannot be used on this box.

Detection turns these into findings with their fix; telemetry, the energy meter
and calibration fall back to what they can measure without the library.
"""

from __future__ import annotations


class NvmlUnavailable(Exception):
    """NVML cannot be used: ``cause`` is what the library (or its import) raised."""

    def __init__(self, message: str, cause: BaseException):
        super().__init__(f"{message}: {cause}")
        self.cause = cause


class NvmlNotImportable(NvmlUnavailable):
    """The ``nvidia-ml-py`` package (module ``pynvml``) does not import."""

    def __init__(self, cause: BaseException):
        super().__init__("nvidia-ml-py is not importable", cause)


class NvmlInitFailed(NvmlUnavailable):
    """``nvmlInit`` failed: no driver library, an unloaded kernel driver, or no permission."""

    def __init__(self, cause: BaseException):
        super().__init__("NVML failed to start", cause)
