"""Schemas every part of the API shares: error bodies, each operation's `responses`, `Worded`,
which answers a field's rules in the lab's words, and `DocumentedAs`, which documents a plain JSON
field as one of rlcore's config models."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from ninja import Field, Schema
from pydantic import BaseModel, StringConstraints, TypeAdapter, ValidationError, model_serializer
from pydantic_core import PydanticCustomError, core_schema

RULE = "field_rule"
"""The error type of a rule a field breaks, in the lab's words (`Worded`, `rule_error`): the API
locates it as it locates a `lab.errors.FieldError`, the source then the field's path as text."""


def rule_error(message: str) -> PydanticCustomError:
    """A validator's refusal in the lab's words (raise it), kept as written."""
    return PydanticCustomError(RULE, message)


class Worded:
    """`Annotated[T, <its rules: Literal, Field(ge=…, le=…), lengths, validators>, Worded(says)]`:
    a field declared once with its rules as its type, answered in the lab's words. A value that is
    not even a `reads_as` (by default the field's plain type, `T` without the rules) keeps pydantic's
    words ("Input should be a valid integer"); one that is, but that the rules refuse, is answered
    `says(value)`, the value as `reads_as` reads it (a JSON 1 for a float field: 1.0). The OpenAPI
    document shows the field as `reads_as`, without its rules (their words say them)."""

    def __init__(self, says: Callable[[Any], str], reads_as: Any = None) -> None:
        self.says = says
        self.reads_as = reads_as

    def __get_pydantic_core_schema__(self, source: Any, handler) -> core_schema.CoreSchema:
        reads_as = source if self.reads_as is None else self.reads_as
        # Built at the first refusal: `reads_as` may be a model still being built now.
        reader: TypeAdapter | None = None

        def check(value: Any, validate, info) -> Any:
            nonlocal reader
            try:
                return validate(value)
            except ValidationError:
                reader = reader or TypeAdapter(reads_as)
                read = reader.validate_python(value, context=info.context)
                raise rule_error(self.says(read)) from None

        return core_schema.with_info_wrap_validator_function(
            check, handler(source), json_schema_input_schema=handler.generate_schema(reads_as)
        )

    def __get_pydantic_json_schema__(self, schema, handler) -> dict[str, Any]:
        """`reads_as` in both modes (a response's field too: `ClaimOut.parts`' `ClaimPartIn`)."""
        return handler(schema["json_schema_input_schema"])


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
