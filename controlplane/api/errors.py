"""Domain errors -> HTTP, in one place. Every error body is `{"error": code, "detail": text}`.

400 names each bad field with the value that was sent; 409 is a conflict with what exists
(an oversold pool with its numbers, a tenant's quota or allowance with its, its cap on API
keys, a protected delete, a race on a unique name); 429 for a tenant's rate of new API keys;
503 when
the cluster driver cannot act (with Retry-After). The request's
transaction is rolled back whenever an error is answered, so nothing is half-written.
"""

import re
from typing import Any

from django.apps import apps
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.db.models import Model, ProtectedError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from capacity.ledger import AllowanceExceeded, Oversold, QuotaExceeded, as_json_number
from controlplane.api.filters import principal_of_request
from controlplane.selling import EndpointReserved, MoveRefused, NoPlacement
from controlplane.tenants.key_limits import KeyLimitReached
from dataplane.cluster.driver import ClusterError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = _response_for(exc, context)
    set_rollback()  # after building the body: a rolled-back transaction runs no more queries
    return response


def _response_for(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ClusterError):
        return Response(
            {"error": "cluster_unavailable", "detail": str(exc)},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, KeyLimitReached):  # 409 for the cap, 429 with Retry-After for the rate
        return Response(
            {"error": "api_key_limit" if exc.status == 409 else "api_key_rate", "detail": exc.message},
            status=exc.status,
            headers={"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None,
        )
    if isinstance(exc, Oversold):
        return Response(oversold_body(exc, _by_operator(context)), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, NoPlacement):
        return Response(no_placement_body(exc, _by_operator(context)), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, QuotaExceeded):
        return Response(quota_body(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, AllowanceExceeded):
        return Response(allowance_body(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, MoveRefused):
        return Response(move_refused_body(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, EndpointReserved):
        return Response(reserved_body(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, ProtectedError):
        users = sorted({_describe(obj) for obj in exc.protected_objects})
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        return Response(
            {"error": "protected", "detail": f"still in use by: {shown}"},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, IntegrityError):
        return Response(conflict_body(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DataError):  # a value the database cannot hold; its text stays in the log
        return Response(
            {
                "error": "invalid",
                "detail": "a value is out of range or malformed for its field",
                "fields": {},
            },
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {"error": "too_large", "detail": "The request body is larger than the server accepts."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
    if isinstance(exc, exceptions.ValidationError):
        return Response(validation_body(exc.detail, context), status=exc.status_code)
    if isinstance(exc, exceptions.APIException):
        headers: dict[str, str] = {}
        if auth_header := getattr(exc, "auth_header", None):  # DRF's view sets it on a 401
            headers["WWW-Authenticate"] = auth_header
        if wait := getattr(exc, "wait", None):  # Throttled's seconds (None when unknown)
            headers["Retry-After"] = str(int(wait))
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else "error"
        return Response({"error": code, "detail": str(exc.detail)}, status=exc.status_code, headers=headers)
    if _is_not_found(exc):
        return Response({"error": "not_found", "detail": "Not found."}, status=status.HTTP_404_NOT_FOUND)
    return None  # a bug: let Django answer 500 and log it


# The pool's figures in an oversold body: the same names and values as /api/v1/capacity/ shows.
LEDGER_FIGURES = [
    "node_count", "gpus_per_node", "overcommit", "have_gpus", "sellable_gpus", "committed_replicas",
    "committed_gpus", "sold_replicas", "sold_gpus", "used_gpus", "free_gpus", "stranded_gpus",
    "headroom_gpus", "unplaced_replicas", "have_mu_per_minute", "sellable_mu_per_minute",
    "committed_mu_per_minute", "sold_mu_per_minute", "used_mu_per_minute", "headroom_mu_per_minute",
]  # fmt: skip


# What a tenant's oversold body keeps of them: the pool's hardware, which it reads at /pools/.
TENANT_LEDGER_FIGURES = ["node_count", "gpus_per_node", "have_gpus"]


def oversold_body(exc: Oversold, operator: bool = True) -> dict[str, Any]:
    """What the change asked, what it would replace and how many replicas fit; an operator also
    sees the pool as /capacity/ shows it (the default), a tenant only its hardware (Oversold:
    the two views)."""
    figures = LEDGER_FIGURES if operator else TENANT_LEDGER_FIGURES
    r = exc.rollout
    rollout = {} if r is None else {
        "rollout": {
            "new_version": r.new_version,
            "old_version": r.old_version,
            "old_model": r.old_model,
            "old_replicas": r.old_asked.replicas,
            "old_gpus_per_replica": r.old_asked.shape.gpus_per_replica,
            "old_gpus": r.old_asked.gpus,
            "old_replacing_replicas": r.old_replacing.replicas,
        }
    }  # fmt: skip
    return {
        "error": "oversold",
        "detail": str(exc) if operator else exc.tenant_message(),
        "pool": exc.pool,
        **{name: as_json_number(getattr(exc.ledger, name)) for name in figures},
        "asked_replicas": exc.asked.replicas,
        "asked_gpus_per_replica": exc.asked.shape.gpus_per_replica if exc.asked.replicas else None,
        "asked_gpus": as_json_number(exc.asked.gpus),
        "asked_mu_per_minute": as_json_number(exc.asked.mu_per_minute),
        "fit_replicas": exc.fit_replicas,
        "replacing_replicas": exc.replacing.replicas,
        "replacing_gpus": as_json_number(exc.replacing.gpus),
        "replacing_mu_per_minute": as_json_number(exc.replacing.mu_per_minute),
        **rollout,
    }


def no_placement_body(exc: NoPlacement, operator: bool) -> dict[str, Any]:
    """What the preferred region lacks and where the replicas would fit; an operator also sees
    every pool and what fits in it, a tenant not other pools' free capacity (NoPlacement)."""
    body: dict[str, Any] = {
        "error": "no_placement",
        "detail": str(exc) if operator else exc.tenant_message(),
        "region": exc.region,
        "model": exc.model,
        "gpu_type": exc.gpu_type,
        "asked_replicas": exc.replicas,
        "gpus_per_replica": exc.gpus_per_replica,
        "pool": exc.pool,
        "fit_replicas": exc.fit_replicas,
        "regions_that_fit": exc.regions_that_fit,
    }
    if operator:
        body["pools"] = [{"pool": p.name, "region": p.region, "fit_replicas": fit} for p, fit in exc.options]
    return body


def _by_operator(context: dict[str, Any]) -> bool:
    principal = principal_of_request(context.get("request")) if context else None
    return principal is not None and principal.is_operator


def quota_body(exc: QuotaExceeded) -> dict[str, Any]:
    return {
        "error": "over_quota",
        "detail": str(exc),
        "tenant": exc.tenant,
        "gpu_quota": exc.quota,
        "bound": exc.which,
        "asked_gpus": exc.asked_gpus,
        "other_endpoints_gpus": exc.others_gpus,
        "total_gpus": exc.total_gpus,
        "rollout": exc.rollout,
    }


def allowance_body(exc: AllowanceExceeded) -> dict[str, Any]:
    return {
        "error": "over_allowance",
        "detail": str(exc),
        "tenant": exc.tenant,
        "pool": exc.pool,
        "allowance_gpus": exc.allowance,
        "allowance": exc.source,
        "asked_gpus": exc.asked_gpus,
        "other_endpoints_gpus": exc.others_gpus,
        "total_gpus": exc.total_gpus,
    }


def reserved_body(exc: EndpointReserved) -> dict[str, Any]:
    r = exc.reservation
    return {
        "error": "protected",
        "detail": str(exc),
        "reservation": {"id": r.pk, "mu_per_minute": r.mu_per_minute, "sold_by": r.sold_by},
    }


def move_refused_body(exc: MoveRefused) -> dict[str, Any]:
    r = exc.reservation
    return {
        "error": "protected",
        "detail": str(exc),
        "fields": {exc.field: {"errors": [str(exc)]}},
        "pool": exc.endpoint.pool.name,
        "to_pool": exc.to.name,
        "pods": exc.pods,
        "reservation": (
            None if r is None else {"id": r.pk, "mu_per_minute": r.mu_per_minute, "sold_by": r.sold_by}
        ),
    }


def conflict_body(exc: IntegrityError) -> dict[str, Any]:
    """A unique value taken by a concurrent write: which resource and fields, never the database's
    text (it names constraints and echoes values)."""
    model, fields = _unique_violation(exc)
    noun = str(model._meta.verbose_name) if model is not None else "object"
    if fields:
        detail = f"another {noun} already has this {' and '.join(fields)}"
    else:
        detail = f"conflicts with an existing {noun}; nothing was written"
    return {
        "error": "conflict",
        "detail": detail,
        "fields": {f: {"errors": ["already taken"]} for f in fields},
    }


_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (.+)")
_PG_KEY = re.compile(r"Key \(([^)]*)\)=")


def _unique_violation(exc: IntegrityError) -> tuple[type[Model] | None, list[str]]:
    """(model, field names) of the unique constraint `exc` broke, as far as the driver says."""
    diag = getattr(exc.__cause__, "diag", None)  # psycopg's
    if diag is not None:
        for model in apps.get_models():
            for constraint in model._meta.constraints:
                if constraint.name == diag.constraint_name and hasattr(constraint, "fields"):
                    return model, list(constraint.fields)
        key = _PG_KEY.match(diag.message_detail or "")
        columns = [c.strip() for c in key.group(1).split(",")] if key else []
        return _fields_of(diag.table_name, columns)
    if match := _SQLITE_UNIQUE.match(str(exc)):
        qualified = [c.strip().split(".", 1) for c in match.group(1).split(",")]
        return _fields_of(qualified[0][0], [c[-1] for c in qualified])
    return None, []


def _fields_of(table: str | None, columns: list[str]) -> tuple[type[Model] | None, list[str]]:
    model = next((m for m in apps.get_models() if m._meta.db_table == table), None)
    if model is None:
        return None, []
    by_column = {f.column: f.name for f in model._meta.concrete_fields}
    return model, [by_column[c] for c in columns if c in by_column]


def validation_body(detail: Any, context: dict[str, Any]) -> dict[str, Any]:
    sent = _sent_data(context)
    if isinstance(detail, dict):
        fields: dict[str, dict[str, Any]] = {}
        lines = []
        for field, errors in detail.items():
            messages = _flatten(errors)
            entry: dict[str, Any] = {"errors": messages}
            if field in sent:
                entry["value"] = sent[field]
            fields[field] = entry
            got = f" (got {sent[field]!r})" if field in sent else ""
            lines.append(f"{field}: {' '.join(messages)}{got}")
        return {"error": "invalid", "detail": "; ".join(lines), "fields": fields}
    return {"error": "invalid", "detail": " ".join(_flatten(detail)), "fields": {}}


def _flatten(errors: Any) -> list[str]:
    if isinstance(errors, dict):
        return [f"{key}: {msg}" for key, value in errors.items() for msg in _flatten(value)]
    if isinstance(errors, list):
        return [msg for item in errors for msg in _flatten(item)]
    return [str(errors)]


def _sent_data(context: dict[str, Any]) -> dict[str, Any]:
    request = context.get("request") if context else None
    try:
        data = request.data if request is not None else {}
    except exceptions.ParseError:
        return {}
    return data if isinstance(data, dict) else {}


def _describe(obj: Model) -> str:
    # No query here: the failed delete may have left the transaction unusable.
    return f"{obj._meta.verbose_name} {getattr(obj, 'name', None) or obj.pk!r}"


def _is_not_found(exc: Exception) -> bool:
    return isinstance(exc, Http404 | ObjectDoesNotExist)
