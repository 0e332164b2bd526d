"""Text as the database can store it and as a team member may see it."""

from __future__ import annotations

from django.conf import settings


def storable(text: str) -> str:
    """`text` as PostgreSQL can store it: a NUL character (which model output and error messages
    can hold) becomes U+FFFD, the replacement character."""
    return text.replace("\x00", "\ufffd")


def public_error(text: str) -> str:
    """An error message as the pages and the API show it: storable, and with paths inside
    `LAB_VAR_DIR` relative to it (`runs/<key>/…`), so no server path reaches a team member."""
    return storable(text).replace(f"{settings.VAR_DIR}/", "")


def field_names(fields: list[str]) -> dict[str, str]:
    """Each varied config field's short name: its last part (`minibatches`), or the whole dotted
    path where two fields share a last part."""
    last = [f.rsplit(".", 1)[-1] for f in fields]
    return {f: (short if last.count(short) == 1 else f) for f, short in zip(fields, last, strict=True)}


def variant_label(variant: dict) -> str:
    """A run's values of a sweep's other axes as text: "minibatches=4, dtype=bfloat16" ("" if none)."""
    names = field_names(list(variant))
    return ", ".join(f"{names[f]}={_shown(v)}" for f, v in variant.items())


def _shown(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
