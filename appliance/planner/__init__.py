"""Which variant, which backend, which devices.

``plan``, ``types``, ``common``, ``estimates``, ``speed``, ``llamacpp``, ``vllm``
and ``quality`` are pure: no I/O, tested on machine fixtures. ``calibration``
keeps measured footprints and decode speeds; ``service`` gathers the inputs (hardware, store,
catalog) for ``appliancectl doctor|plan`` and ``/admin/hardware|plan``.

The pure modules import nothing of the appliance outside this package except
hardware and modelfacts types; ``service`` and ``calibration`` may import store and db.
"""
