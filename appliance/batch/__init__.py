"""OpenAI's Batch API: files of JSONL request lines (``files``), batches and their line results (``store``), the
checks of an uploaded line (``lines``), the objects the API answers with (``objects``), the runner that sends each
line through the gateway at batch priority in the capacity interactive requests leave (``runner``, ``capacity``,
``deferred``, ``line_call``) and the output and error files written at the end (``finalize``).

May import serving, metering, accounts, db and settings; never api.
"""
