"""The request log: one row for every API request the daemon answered, served, refused or failed.

Lives here: ``entry`` (what is recorded of one request), ``writer`` (the buffered writer: a bounded queue in
memory and one thread that writes what it holds in one transaction, and the pruning by age and row count), and
``queries`` (filters, pages, refusals by reason, CSV). The HTTP edge builds each entry
(``appliance.api.request_trace``); the tokens of a served request are read from its usage row, joined by request id.

May import db, metering (the ledger's transaction helper and time parsing) and errors; never serving or api.
"""
