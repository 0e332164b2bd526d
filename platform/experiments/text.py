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
