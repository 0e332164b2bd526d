"""Each input shape is declared once, its rules as types: `ClaimIn` (a claim, through the API and
the comparison page's form) and `ComparisonParams` (the comparison query, through the API and the
pages). The bad values here are made from those declarations, just past each bound or a choice not
offered, so a field or parameter added with a rule is tried on every way in without a test naming
it: each refuses it alike, naming the field, in words that start with its name."""

from __future__ import annotations

import json
import math
from typing import Any, Literal, get_args, get_origin

import pytest
from annotated_types import Ge, Le, MaxLen, MinLen
from django.urls import reverse
from pydantic import StringConstraints
from pydantic.fields import FieldInfo

from dashboards.claims.schemas import ClaimIn, ClaimPartIn
from dashboards.comparison.query import ComparisonParams, ComparisonQuery
from dashboards.models import Claim

pytestmark = pytest.mark.django_db

PART = {"kind": "holds", "x": "grpo"}


def bounds(info: FieldInfo) -> list[tuple[str, Any]]:
    """The field's declared bounds: ("ge" | "le" | "min" | "max", bound)."""
    found = []
    for rule in info.metadata:
        if isinstance(rule, Ge):
            found.append(("ge", rule.ge))
        if isinstance(rule, Le):
            found.append(("le", rule.le))
        if isinstance(rule, MinLen | StringConstraints) and rule.min_length is not None:
            found.append(("min", rule.min_length))
        if isinstance(rule, MaxLen | StringConstraints) and rule.max_length is not None:
            found.append(("max", rule.max_length))
    return found


def sized(info: FieldInfo, n: int) -> Any:
    """A value of the field's kind with n items (n characters for text)."""
    if info.annotation is str:
        return "m" * n
    item = get_args(get_args(info.annotation)[0])[0]  # list[item] | None
    return [PART if item is ClaimPartIn else f"s{i}" for i in range(n)]


def values(info: FieldInfo, text: bool = False) -> tuple[list[Any], list[Any]]:
    """(values its rules refuse, values at its bounds they take), as JSON has them or, with
    `text`, as a query string does."""
    if get_origin(info.annotation) is Literal or info.annotation is bool:
        return ["nope"], []
    out, at = [], []
    for side, bound in bounds(info):
        if side in ("min", "max"):
            out.append(sized(info, bound - 1 if side == "min" else bound + 1))
            at.append(sized(info, bound))
            continue
        away = -1 if side == "ge" else 1
        out.append(bound + away if info.annotation is int else math.nextafter(bound, away * math.inf))
        at.append(bound)
    return ([str(v) for v in out], [str(v) for v in at]) if text else (out, at)


def ruled(model) -> list[tuple[str, FieldInfo]]:
    return [(name, info) for name, info in model.model_fields.items() if values(info)[0]]


CLAIM_FIELDS = [(name, name, info) for name, info in ruled(ClaimIn)] + [
    (f"parts.0.{name}", name, info) for name, info in ruled(ClaimPartIn)
]


def test_the_values_are_read_from_the_declarations():
    """The tests below try at least these (a new field with a rule joins them by itself)."""
    known = {
        "parts",
        "settings",
        "quantifier",
        "metric",
        "k",
        "delta",
        "rule",
        "alpha",
        "title",
        "parts.0.kind",
    }
    assert known <= {field for field, _, _ in CLAIM_FIELDS}
    assert values(ClaimIn.model_fields["k"]) == ([0, 100_001], [1, 100_000])
    assert values(ComparisonParams.model_fields["k"], text=True) == (["0", "100001"], ["1", "100000"])
    assert [name for name, _ in ruled(ComparisonParams)] == list(ComparisonParams.model_fields)


@pytest.mark.parametrize(("field", "name", "info"), CLAIM_FIELDS, ids=[f for f, _, _ in CLAIM_FIELDS])
def test_a_claim_field_past_its_rule_is_refused_alike_by_the_api_and_the_form(
    client, token, alice_client, demo, field, name, info
):
    base = {"experiment": demo.pk, "parts": [PART], "settings": ["sync_offset=2"]}
    refused, taken = values(info)
    for value in refused:
        body = base | ({"parts": [PART | {name: value}]} if field.startswith("parts.0.") else {name: value})
        api = client.post(
            "/api/claims",
            json.dumps(body),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        form = alice_client.post(reverse("claim-new"), json.dumps(body), content_type="application/json")
        assert (api.status_code, form.status_code) == (422, 422), (value, api.content)
        (error,) = api.json()["detail"]
        assert error["loc"] == ["body", *field.split(".")] and error["field"] == field, error
        assert error["msg"].startswith(f"{name} must be"), error
        assert form.json()["detail"] == [{"field": field, "msg": error["msg"]}]
    for value in taken:
        ClaimIn.model_validate(base | {name: value})  # at its bound: within the rule
    assert not Claim.objects.exists()


@pytest.mark.parametrize("name", list(ComparisonParams.model_fields))
def test_a_query_parameter_past_its_rule_is_refused_alike_by_the_pages_and_the_api(
    client, token, alice_client, demo, name
):
    refused, taken = values(ComparisonParams.model_fields[name], text=True)
    for value in refused:
        page = alice_client.get(reverse("experiment-compare-data", args=[demo.pk]), {name: value})
        api = client.get(
            f"/api/experiments/{demo.pk}/compare", {name: value}, HTTP_AUTHORIZATION=f"Bearer {token}"
        )
        assert (page.status_code, api.status_code) == (400, 422), value
        ((param, msg),) = [(e["param"], e["msg"]) for e in page.json()["detail"]]
        assert param == name and msg.startswith(f"{name} must be")
        assert api.json()["detail"] == [{"loc": ["query", name], "field": name, "msg": msg}]
    for value in taken:
        ComparisonParams.model_validate({name: value})


def test_the_querys_defaults_are_the_declarations():
    assert ComparisonParams().query() == ComparisonQuery.parse({}) == ComparisonQuery()
