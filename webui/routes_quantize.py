"""Quantize an installed GGUF variant from the models page, as a job with its progress bar.

The request is checked as ``POST /admin/models/{name}/quantize`` checks it
(``ModelStore.prepare_quantize``: a known target smaller than the source, a
writable store, no such variant yet), so a refusal answers at once; the work
then runs as a job of the shared registry, audited under the signed-in user,
and its bar streams like a pull's. Admins only.
"""

from __future__ import annotations

import anyio
from litestar import Request, Response, post

from appliance.db.audit import AuditTrail
from appliance.serving.names import ModelNames
from appliance.store.jobs import JobRegistry
from appliance.store.store import ModelStore
from appliance.webui import forms
from appliance.webui.context import ConsoleUser
from appliance.webui.gate import needs
from appliance.webui.jobs_view import submit
from appliance.webui.render import partial


@post("/models/quantize", guards=[needs("admin")], include_in_schema=False)
async def quantize(
    request: Request, store: ModelStore, jobs: JobRegistry, names: ModelNames, audit: AuditTrail, user: ConsoleUser
) -> Response:
    form = await request.form()
    name, to = forms.required(form, "name", 200), forms.required(form, "to", 16)
    source, target = await anyio.to_thread.run_sync(lambda: store.prepare_quantize(name, to))
    label = f"{source.family}:{target}"
    job = submit(jobs, names, "quantize", label, lambda ctx: store.quantize(source.name, target, ctx=ctx).to_dict())
    audit.record(user.actor, "model.quantize", label, f"job={job.id} from={source.name}")
    return partial(request, "_job.html", job=job.view())


HANDLERS = [quantize]
