"""`MoveModels`: a migration operation that moves models to another app in Django's state only.
Their tables keep their names (each model's `db_table`), and every relation to them, in any app,
is repointed, so the database is not touched."""

from __future__ import annotations

from django.db.migrations.operations.base import Operation
from django.db.migrations.utils import get_references

# The models that left the `experiments` app (issue 21), by the app they are in now (lowercase
# model names, as content types and admin URLs spell them).
MOVED_FROM_EXPERIMENTS = {
    "team": "accounts",
    "membership": "accounts",
    "invitation": "accounts",
    "apitoken": "accounts",
    "worker": "execution",
}


class MoveModels(Operation):
    """Move the models `names` from app `source` to app `target` (as `ProjectState.rename_model`
    renames a model, with the app label changing instead of the name)."""

    reversible = True
    reduces_to_sql = False

    def __init__(self, source: str, target: str, names: list[str]):
        self.source, self.target, self.names = source, target, names

    def deconstruct(self):
        return (
            self.__class__.__qualname__,
            [],
            {"source": self.source, "target": self.target, "names": self.names},
        )

    def describe(self) -> str:
        return f"Move {', '.join(self.names)} from {self.source} to {self.target} (state only)"

    def state_forwards(self, app_label, state) -> None:
        for name in self.names:
            old, new = (self.source, name.lower()), (self.target, name.lower())
            moved = state.models[old].clone()
            moved.app_label = self.target
            moved.options.setdefault("db_table", f"{self.source}_{name.lower()}")  # the table it had
            state.models[new] = moved
            to_reload = set()
            for model_state, field_name, field, reference in get_references(state, old):
                changed = field.clone()
                if reference.to:
                    changed.remote_field.model = f"{self.target}.{name}"
                if reference.through:
                    changed.remote_field.through = f"{self.target}.{name}"
                model_state.fields[field_name] = changed
                to_reload.add((model_state.app_label, model_state.name_lower))
            state._relations = None  # recomputed on next use, with the moved model's new label
            state.reload_models(to_reload, delay=True)
            state.remove_model(*old)
            state.reload_model(*new, delay=True)

    def database_forwards(self, app_label, schema_editor, from_state, to_state) -> None:
        pass  # the tables stay as they are

    def database_backwards(self, app_label, schema_editor, from_state, to_state) -> None:
        pass
