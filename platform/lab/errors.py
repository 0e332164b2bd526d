"""The one shape of bad input every room raises: the field (a form's, a body's or a query
parameter's name) and the rule it broke, and for a query string the position of the mistake.
Pages show it beside the field; the API answers 422 with `field`, `msg` (and `position`). A shape
pydantic validates (`lab.schemas.Worded`) gives its first error as one (`first_of`)."""

from __future__ import annotations


class FieldError(ValueError):
    def __init__(self, field: str, message: str, position: int | None = None):
        self.field = field
        self.message = message
        self.position = position
        super().__init__(f"{field}: {message}")

    @classmethod
    def first_of(cls, exc) -> FieldError:
        """The first error of a pydantic `ValidationError`, its location dotted (`parts.0.kind`)."""
        first = exc.errors()[0]
        return cls(".".join(map(str, first["loc"])), first["msg"])
