"""``/dead`` and ``/unknown``: filtered lists with bulk repairs. A bulk repair first shows how
many messages it would touch (a dry run that changes nothing), then runs in batches in the
background while ``/jobs/<id>`` shows its progress."""

from __future__ import annotations

import dataclasses

from flask import Blueprint, abort, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from delivery import ops
from delivery.console.context import actor, before, db, state
from delivery.console.jobs import BulkRequest
from delivery.core.status import Status

__all__ = ["blueprint"]

blueprint = Blueprint("bulk", __name__)

# action -> (the status it applies to, its label, the job's action)
_BULK = {
    "redrive-dead": (Status.DEAD, "Redrive", "redrive"),
    "redrive-unknown": (Status.UNKNOWN, "Redrive (lookup first)", "redrive"),
    "resolve-sent": (Status.UNKNOWN, "Resolve as sent", "resolve-sent"),
    "resolve-dead": (Status.UNKNOWN, "Resolve as dead", "resolve-dead"),
}
_LIST_FIELDS = ("provider", "type", "code", "since", "until", "key")


def _filter(status: Status) -> ops.MessageFilter:
    values = {name: request.values.get(name, "") for name in _LIST_FIELDS}
    return dataclasses.replace(ops.parse_filter(values), status=status)


def _list(status: Status) -> str:
    flt = _filter(status)
    older_than = before("a message id")
    page = ops.search(db(), flt, before=older_than, limit=50)
    params = flt.query_params()
    params.pop("status", None)
    # Nothing matches the filter (an empty first page): no bulk action to offer.
    nothing = not page.messages and older_than is None
    actions = [] if nothing else [(n, spec[1]) for n, spec in _BULK.items() if spec[0] is status]
    return render_template(
        "bulk_list.html",
        status=status.value,
        flt=flt,
        params=params,
        page=page,
        mask=ops.message_dict,
        actions=actions,
        providers=sorted(state().settings.providers),
    )


@blueprint.get("/dead")
def dead_page() -> str:
    return _list(Status.DEAD)


@blueprint.get("/unknown")
def unknown_page() -> str:
    return _list(Status.UNKNOWN)


@blueprint.get("/bulk/<action>")
def bulk_confirm(action: str) -> str:
    if action not in _BULK:
        abort(404)
    status, label, _ = _BULK[action]
    flt = _filter(status)
    count = len(ops.matching_ids(db(), flt))
    params = flt.query_params()
    params.pop("status", None)
    return render_template(
        "bulk_confirm.html",
        action=action,
        label=label,
        status=status.value,
        count=count,
        params=params,
    )


@blueprint.post("/bulk/<action>")
def bulk_run(action: str) -> Response:
    if action not in _BULK:
        abort(404)
    status, label, op = _BULK[action]
    ids = ops.matching_ids(db(), _filter(status))
    job = state().jobs.start(BulkRequest(op, ids, actor(), f"{label} {len(ids)} {status.value}"))
    return redirect(url_for("bulk.job_page", job_id=job), 303)


@blueprint.get("/jobs/<job_id>")
def job_page(job_id: str) -> str:
    progress = state().jobs.get(job_id)
    if progress is None:
        abort(404)
    return render_template("job.html", job_id=job_id, p=progress)
