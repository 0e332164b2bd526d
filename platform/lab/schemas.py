"""Schemas every part of the API shares: error bodies, each operation's `responses`, and
`DocumentedAs`, which documents a plain JSON field as one of rlcore's config models."""

from __future__ import annotations

from typing import Annotated, Any

from ninja import Field, Schema
from pydantic import BaseModel, StringConstraints, model_serializer
from pydantic_core import core_schema


class DocumentedAs:
    """For `Annotated[dict[str, Any], DocumentedAs(Model)]`: the field stays a plain JSON object
    (validated where it is used, e.g. by `sweeps.expand` with the allowed data and model roots),
    but the OpenAPI schema gives it `Model`'s JSON schema, as a reference to the `Model` component."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model

    def __get_pydantic_json_schema__(self, schema, handler) -> dict[str, Any]:
        model = self.model.__pydantic_core_schema__
        return handler(
            core_schema.definitions_schema(core_schema.definition_reference_schema(model["ref"]), [model])
        )


class ErrorOut(Schema):
    detail: str = Field(description="what was wrong, in words")


class FieldErrorOut(Schema):
    loc: list[str | int] = Field(description="where: body, query or path, then the field's path")
    field: str = Field(description="the field, dotted (config.rollout.group_size, limit, seeds.1)")
    msg: str = Field(description="the rule it broke")
    position: int | None = Field(
        None, description="in a runs query (`q`), the 0-based offset of the mistake in its text"
    )

    @model_serializer(mode="wrap")
    def _without_no_position(self, handler):
        """`position` only where there is one (a runs query's mistake)."""
        data = handler(self)
        if data.get("position") is None:
            data.pop("position", None)
        return data


class ValidationErrorOut(Schema):
    detail: list[FieldErrorOut] = Field(description="one entry per field that is wrong")


def responses(ok: dict[int, Any], *errors: int) -> dict[int, Any]:
    """An operation's `response=`: its success schema(s), 401 (every operation needs a token) and
    the given error statuses, 422 with the field errors' body and the others with `ErrorOut`."""
    return {**ok, **{code: ValidationErrorOut if code == 422 else ErrorOut for code in (401, *errors)}}


NoNul = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
"""Text PostgreSQL can store, as every body and query field that reaches the database takes it: no
NUL, and no lone surrogate (`"\\ud800"` in JSON), which UTF-8 cannot encode; pydantic refuses that
before it matches the pattern ("unable to parse raw data as a unicode string"), a 422 naming the field."""
