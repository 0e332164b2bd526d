"""docs/imports.md stays true to the default mappings it lists."""

from __future__ import annotations

from pathlib import Path

from imports.formats import DEFAULT_MAPPINGS, trl

DOC = (Path(__file__).parents[3] / "docs" / "imports.md").read_text()


def test_every_tabled_mapping_is_in_the_doc_and_every_doc_row_in_the_mapping():
    for tool in ("prime-rl", "verl", "trl"):
        section = DOC.split(f"\n## {'TRL' if tool == 'trl' else tool}")[1].split("\n## ")[0]
        rows = {
            tuple(cell.strip(" `") for cell in line.strip("|").split("|"))
            for line in section.splitlines()
            if line.startswith("| `")
        }
        assert rows == set(DEFAULT_MAPPINGS[tool].items()), tool


def test_the_mappings_the_doc_describes_as_unions_are_those_unions():
    prime, verl, trainer = DEFAULT_MAPPINGS["prime-rl"], DEFAULT_MAPPINGS["verl"], DEFAULT_MAPPINGS["trl"]
    assert DEFAULT_MAPPINGS["tensorboard"] == {**verl, **trl.rewritten(trainer)}
    assert DEFAULT_MAPPINGS["mlflow"] == {**verl, **trainer}
    assert DEFAULT_MAPPINGS["wandb"] == {**prime, **verl, **trl.rewritten(trainer)}
    assert DEFAULT_MAPPINGS["trackio"] == trl.rewritten(trainer)
    assert trl.rewritten({"eval_reward": "eval/reward", "loss": "loss"}) == {
        "eval/reward": "eval/reward",
        "train/loss": "loss",
    }
