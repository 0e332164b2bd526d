"""What the import tests share: prime-rl `metrics.jsonl` files written as its file monitor writes
them, one JSON object a line, with values the tests can check, and an API client by token."""

from __future__ import annotations

import io
import json
from pathlib import Path

from django.core.management import call_command

T0 = 1_764_800_000.0  # the file's own wall-clock times: T0 + 10 s a step


def accuracy(step: int, steps: int, final: float) -> float:
    """Climbs linearly from 0.25 to `final`, as `sample_experiments` runs do."""
    return 0.25 + step / steps * (final - 0.25)


def prime_rl_file(
    path: Path, seed: int = 0, steps: int = 20, final: float = 0.6, eval_every: int = 5
) -> Path:
    """A prime-rl metrics.jsonl: every step `reward/mean`, `loss/mean` and `progress/tokens`; every
    `eval_every` steps and the last, `eval/acc` (held-out accuracy climbing to `final`)."""
    rows = []
    for step in range(steps + 1):
        row = {
            "step": step,
            "time": T0 + 10 * step,
            "reward/mean": step / steps * 0.5 + 0.05 * seed,
            "loss/mean": 1.0 / (1 + step),
            "progress/tokens": 1000 * step,
        }
        if step % eval_every == 0 or step == steps:
            row["eval/acc"] = accuracy(step, steps, final)
        rows.append(row)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def import_command(path: Path, experiment, **options) -> str:
    """`manage.py import` as alice, with the prime-rl tool unless told; what it printed."""
    out = io.StringIO()
    options.setdefault("tool", "prime-rl")
    options.setdefault("user", "alice")
    call_command("import", str(path), experiment=experiment.pk, stdout=out, **options)
    return out.getvalue()


class Api:
    """Calls to /api with a bearer token through Django's test client."""

    def __init__(self, client, token: str):
        self.client, self.headers = client, {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    def call(self, method: str, path: str, body=None):
        kwargs = {} if body is None else {"data": json.dumps(body), "content_type": "application/json"}
        return getattr(self.client, method)(f"/api{path}", **kwargs, **self.headers)

    def upload(self, experiment_id: int, path: Path, **fields):
        with path.open("rb") as stream:
            return self.client.post(
                f"/api/experiments/{experiment_id}/imports", {"file": stream, **fields}, **self.headers
            )
