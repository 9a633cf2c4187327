"""What requests cost and who may still spend: the meter (``meter``: admit, settle, release) on its own connection and
writer (``meter_db``), admission against the quotas (``admission``) and the reservations it makes on their counters
(``reservation``), the usage rows and charges of settlement (``settlement``), the group-commit ledger (``ledger``),
quota windows (``quotas``), prices (``pricing``), roll-ups, usage reports (``reports``) with their filters
(``usage_filters``) and time buckets and percentiles (``series``), the administration of quotas, prices and teams
(``admin``), and the box's own figures: latency-target attainment (``attainment``), owner cost, busy share and
headroom (``economics``, ``box_figures``).

May import accounts and db; never serving or api.
"""
