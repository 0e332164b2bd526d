"""The sweep form's run-parameter fields, generated from `RunConfig.model_json_schema()`: one
blank-allowed field per scalar leaf (dotted config paths, labels, help and initial values from
the schema), a task kind's fields marked with the kinds that have them. No bounds are checked
here: the grid is validated by `sweeps.expand`."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django import forms

from rlcore.config import RunConfig

# Set per run by the grid, so not run-parameter fields of the form.
GRID_AXES = ("algorithm.preset", "staleness", "seed")


@dataclass(frozen=True)
class ParamField:
    """One scalar leaf of RunConfig; `variants` restricts a task field to the task kinds that have it."""

    path: str
    node: dict[str, Any]
    section: str
    section_title: str
    variants: frozenset[str] | None = None


def _deref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return {
            **schema["$defs"][node["$ref"].rsplit("/", 1)[1]],
            **{k: v for k, v in node.items() if k != "$ref"},
        }
    return node


def _leaves(
    schema: dict[str, Any], node: dict[str, Any], prefix: str, section: str, section_title: str
) -> list[ParamField]:
    out = []
    for name, prop in node["properties"].items():
        path = f"{prefix}{name}"
        if path in GRID_AXES:
            continue
        prop = _deref(schema, prop)
        title = prop.get("title", path)
        if "discriminator" in prop:
            key = prop["discriminator"]["propertyName"]
            mapping = prop["discriminator"]["mapping"]
            first = _deref(schema, {"$ref": next(iter(mapping.values()))})["properties"][key]
            kind_node = {
                "enum": list(mapping),
                "default": prop.get("default", {}).get(key, next(iter(mapping))),
                "title": first.get("title"),
                "description": first.get("description"),
            }
            out.append(ParamField(f"{path}.{key}", kind_node, path, title))
            by_path: dict[str, ParamField] = {}
            for variant_name, ref in mapping.items():
                variant = _deref(schema, {"$ref": ref})
                for leaf in _leaves(schema, variant, f"{path}.", path, title):
                    if leaf.path == f"{path}.{key}":
                        continue
                    seen = by_path.get(leaf.path)
                    kinds = (seen.variants if seen else frozenset()) | {variant_name}
                    by_path[leaf.path] = ParamField(leaf.path, (seen or leaf).node, path, title, kinds)
            every_kind = frozenset(mapping)
            out.extend(
                ParamField(
                    leaf.path, leaf.node, path, title, None if leaf.variants == every_kind else leaf.variants
                )
                for leaf in by_path.values()
            )
        elif "properties" in prop:
            out.extend(_leaves(schema, prop, f"{path}.", path, title))
        else:
            out.append(ParamField(path, prop, section, section_title))
    return out


class _TypedNumber:
    """A number field typed into a text box: the browser submits exactly what was typed (a number
    box drops letters and submits a blank, which meant the default), and a value that is not a
    number is refused, naming what was typed and the default."""

    what = "a number"

    def __init__(self, *, default=None, **kwargs):
        self.default = default
        super().__init__(**kwargs)

    def to_python(self, value):
        try:
            return super().to_python(value)
        except forms.ValidationError as exc:
            if exc.code != "invalid":
                raise
            blank = "the preset's value" if self.default is None else f"the default, {self.default}"
            raise forms.ValidationError(
                f"“{str(value)[:50]}” is not {self.what}; leave it blank for {blank}", code="invalid"
            ) from None


class TypedIntegerField(_TypedNumber, forms.IntegerField):
    what = "a whole number"


class TypedFloatField(_TypedNumber, forms.FloatField):
    what = "a number"


_FIELD_CLASSES = {
    "integer": TypedIntegerField,
    "number": TypedFloatField,
    "string": forms.CharField,
    "boolean": forms.BooleanField,
}


def _form_field(param: ParamField) -> forms.Field | None:
    """A blank-allowed form field for one scalar leaf (None for lists and mappings), labelled
    with the schema's title and helped by its description. A leaf without a default (an
    algorithm knob) offers blank as "the preset's value"; the placeholder of a blank box says
    what blank means ("default 150"), so it never reads as a value typed in."""
    options = [n for n in param.node.get("anyOf", [param.node]) if n.get("type") != "null"]
    if len(options) != 1:
        return None
    kind = options[0]
    has_default = "default" in param.node
    label = param.node.get("title") or param.path
    common = {"required": False, "label": label, "help_text": param.node.get("description", "")}
    if "enum" in kind:
        choices = [(v, v) for v in kind["enum"]]
        if not has_default:
            choices = [("", "the preset's value"), *choices]
        initial = param.node.get("default", choices[0][0])
        return forms.ChoiceField(choices=choices, initial=initial, **common)
    field_class = _FIELD_CLASSES.get(kind.get("type"))
    if field_class is None:
        return None
    if field_class is forms.BooleanField:
        if not has_default:
            choices = [("", "the preset's value"), ("true", "yes"), ("false", "no")]
            return forms.NullBooleanField(widget=forms.Select(choices=choices), **common)
        return field_class(initial=param.node.get("default"), **common)
    default = param.node.get("default")
    shown = "" if default is None else str(default).replace("\n", "\\n")
    if field_class is forms.CharField:
        placeholder = f"default {shown}" if shown else ""
        return field_class(widget=forms.TextInput(attrs={"placeholder": placeholder}), **common)
    placeholder = f"default {shown}" if default is not None else "the preset's value"
    attrs = {
        "placeholder": placeholder,
        "inputmode": "numeric" if field_class is TypedIntegerField else "decimal",
        "data-number": "integer" if field_class is TypedIntegerField else "float",
        "data-default": shown,
    }
    return field_class(default=default, widget=forms.TextInput(attrs=attrs), **common)


@functools.cache
def run_parameter_fields() -> tuple[tuple[ParamField, forms.Field], ...]:
    """The scalar run parameters a person can set on the form, in schema order, with their fields."""
    schema = RunConfig.model_json_schema()
    pairs = ((param, _form_field(param)) for param in _leaves(schema, schema, "", "run", "Run"))
    return tuple((param, field) for param, field in pairs if field is not None)
