"""Where a team's runs, or a sweep's, are mirrored (`imports.mirror` sends them): the settings and
their rules, here below the apps that keep them (a team's fields, a sweep's spec)."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

URI_CHARS = 500


@dataclass(frozen=True)
class MirrorSettings:
    """Where a run's points are mirrored: an MLflow tracking server ("" for none), TensorBoard
    event files under the run's folder or not."""

    mlflow_uri: str = ""
    tensorboard: bool = False

    @property
    def on(self) -> bool:
        return bool(self.mlflow_uri or self.tensorboard)


SPEC_KEYS = ("mlflow_uri", "tensorboard")  # a sweep spec's "mirror": {key: value}, each optional


def uri_error(uri: str) -> str:
    """Why `uri` is not an MLflow tracking URI the lab can send to ("" when it is one)."""
    if len(uri) > URI_CHARS:
        return f"the MLflow tracking URI is {len(uri)} characters long, more than {URI_CHARS}"
    if any(c.isspace() or ord(c) < 32 for c in uri):
        return "the MLflow tracking URI has a space or a control character in it"
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (
            f"{uri!r} is not an http(s) address of an MLflow tracking server "
            "(e.g. http://mlflow.example.org:5000)"
        )
    try:
        parts.port  # noqa: B018  (read to check it: a port out of range or not a number raises)
    except ValueError:
        return f"{uri!r} has a port that is not a number from 1 to 65535"
    if parts.username is not None or parts.password is not None:
        return (
            "the MLflow tracking URI has a user name or password in it; they would be shown on the "
            "team's page and on runs' notes: give the server's address only"
        )
    if parts.query or parts.fragment:
        return f"{uri!r} has a query or a fragment; give the server's address only"
    return ""


def spec_errors(spec: Any) -> list[tuple[str, str]]:
    """The problems of a sweep's `mirror` setting, each as (field, message)."""
    if not isinstance(spec, dict):
        return [("mirror", 'mirror is an object: {"mlflow_uri": "http://…", "tensorboard": true}')]
    errors = [
        (f"mirror.{key}", f"mirror has no field {key!r}; its fields are {', '.join(SPEC_KEYS)}")
        for key in spec
        if key not in SPEC_KEYS
    ]
    uri = spec.get("mlflow_uri", "")
    if not isinstance(uri, str):
        errors.append(("mirror.mlflow_uri", "mirror.mlflow_uri is a string: an http(s) address or empty"))
    elif uri and (problem := uri_error(uri)):
        errors.append(("mirror.mlflow_uri", problem))
    if not isinstance(spec.get("tensorboard", False), bool):
        errors.append(("mirror.tensorboard", "mirror.tensorboard is true or false"))
    return errors


def settings_for(team, spec: dict | None) -> MirrorSettings:
    """A run's mirroring: its team's, each field overridden where its sweep's spec sets it."""
    mine = (spec or {}).get("mirror") or {}
    return MirrorSettings(
        mlflow_uri=mine.get("mlflow_uri", team.mirror_mlflow_uri) or "",
        tensorboard=bool(mine.get("tensorboard", team.mirror_tensorboard)),
    )
