"""The runs query language (the Runs list's and `GET /api/runs`' `q`), parsed into ORM filters and
never evaluated as code.

    query      := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | "(" query ")" | comparison
    comparison := operand op value
    operand    := field | config path | summary "(" metric ")"
    op         := = | != | < | <= | > | >= | ~ (contains) | !~

Fields: id, experiment (its id), experiment.name, team (its name), preset, staleness, status, seed,
queue, attempt, tag (the run's tags and its experiment's). A config path is a dotted path into the
run's resolved config, starting at one of RunConfig's fields (`algorithm.preset`,
`staleness.sync_offset`, `optimizer.lr`). Summaries of a logged metric: `last(eval/accuracy)`,
`first(…)`, `min(…)`, `max(…)`, `mean(…)`, compared with numbers. Values: numbers, 'quoted' or
"quoted" strings, true / false, or bare words (`grpo`, `rec-oneside-nois`). Keywords are
case-insensitive; `and` binds tighter than `or`. Every error says where: `QuerySyntaxError.position`
is the 0-based offset of the mistake in the text. A config path is plain keys only (no segment may be
one of Django's lookup names, which the ORM would apply), numbers are finite, and parentheses and
`not`s nest at most `MAX_DEPTH` deep.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from django.db.models import Exists, JSONField, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KeyTransform

from experiments import series
from experiments.models import ExperimentTag, Run, RunTag
from rlcore.config import RunConfig

MAX_LENGTH = 2000
MAX_SUMMARIES = 8
MAX_DEPTH = 32
OPS = ("=", "!=", "<", "<=", ">", ">=", "~", "!~")
ORDERED = ("<", "<=", ">", ">=")
LOOKUP = {"=": "exact", "<": "lt", "<=": "lte", ">": "gt", ">=": "gte", "~": "icontains"}
TEXT_FIELDS = {
    "preset": "preset",
    "staleness": "staleness",
    "status": "status",
    "queue": "queue",
    "experiment.name": "experiment__name",
    "team": "experiment__team__name",
}
NUMBER_FIELDS = {"id": "pk", "experiment": "experiment_id", "seed": "seed", "attempt": "attempt"}
SUMMARIES = ("last", "first", "min", "max", "mean")
KEYWORDS = ("and", "or", "not")
# The ORM reads these as comparisons, not keys, in a JSON path (`config__seed__gt`): never a config key.
LOOKUP_NAMES = frozenset(JSONField.get_lookups()) | frozenset(KeyTransform.get_lookups())
TOKEN = re.compile(
    r"""(?P<space>\s+)|(?P<op>!=|<=|>=|!~|==|=|<|>|~)|(?P<open>\()|(?P<close>\))"""
    r"""|(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
    r"""|(?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![\w./-]))"""
    r"""|(?P<word>[A-Za-z_][\w./\-]*)"""
)


class QuerySyntaxError(ValueError):
    def __init__(self, position: int, message: str):
        self.position = position
        self.message = f"at position {position}: {message}"
        super().__init__(self.message)


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    position: int

    @property
    def keyword(self) -> str | None:
        return self.text.lower() if self.kind == "word" and self.text.lower() in KEYWORDS else None


def tokenize(text: str) -> list[Token]:
    tokens, at = [], 0
    while at < len(text):
        match = TOKEN.match(text, at)
        if match is None:
            if text[at] in "'\"":
                raise QuerySyntaxError(at, "a string that is never closed")
            raise QuerySyntaxError(at, f"unexpected character {text[at]!r}")
        kind = match.lastgroup
        if kind != "space":
            tokens.append(Token(kind, match.group(), at))
        at = match.end()
    return tokens


@dataclass
class Parsed:
    """A query's filter and the summary annotations it needs."""

    q: Q
    annotations: dict[str, Any]

    def apply(self, runs: QuerySet[Run]) -> QuerySet[Run]:
        return runs.annotate(**self.annotations).filter(self.q) if self.annotations else runs.filter(self.q)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.at = 0
        self.depth = 0
        self.annotations: dict[str, Any] = {}
        self.summaries: dict[tuple[str, str], str] = {}

    def peek(self) -> Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> Token:
        token = self.peek()
        if token is None:
            raise QuerySyntaxError(len(self.text), "the query ends too early")
        self.at += 1
        return token

    def parse(self) -> Parsed:
        if not self.tokens:
            return Parsed(Q(), {})
        q = self.or_()
        extra = self.peek()
        if extra is not None:
            if extra.kind == "close":
                raise QuerySyntaxError(extra.position, "this ')' closes nothing")
            hint = " (quote values that hold = or spaces: 'sync_offset=2')" if extra.kind == "op" else ""
            raise QuerySyntaxError(extra.position, f"expected and, or, or the end (got {extra.text!r}){hint}")
        return Parsed(q, self.annotations)

    def or_(self) -> Q:
        q = self.and_()
        while (token := self.peek()) is not None and token.keyword == "or":
            self.take()
            q = q | self.and_()
        return q

    def and_(self) -> Q:
        q = self.not_()
        while (token := self.peek()) is not None and token.keyword == "and":
            self.take()
            q = q & self.not_()
        return q

    def not_(self) -> Q:
        token = self.take()
        if token.keyword == "not" or token.kind == "open":
            if self.depth == MAX_DEPTH:
                raise QuerySyntaxError(token.position, f"parentheses and nots nest at most {MAX_DEPTH} deep")
            self.depth += 1
            q = self.nested(token)
            self.depth -= 1
            return q
        if token.kind != "word" or token.keyword:
            raise QuerySyntaxError(
                token.position, f"expected a field, a config path or a summary (got {token.text!r})"
            )
        return self.comparison(token)

    def nested(self, token: Token) -> Q:
        """What follows a `not` or a `(` (`token`), up to its `)`."""
        if token.keyword == "not":
            return ~self.not_()
        q = self.or_()
        close = self.peek()
        if close is None or close.kind != "close":
            where = close.position if close else len(self.text)
            raise QuerySyntaxError(where, f"expected ')' to close the '(' at position {token.position}")
        self.take()
        return q

    def comparison(self, name: Token) -> Q:
        field = name.text
        summary = None
        if field.lower() in SUMMARIES and (open_ := self.peek()) is not None and open_.kind == "open":
            self.take()
            metric = self.take()
            if metric.kind not in ("word", "string"):
                raise QuerySyntaxError(metric.position, f"expected a metric name in {field}(…)")
            close = self.take()
            if close.kind != "close":
                raise QuerySyntaxError(close.position, f"expected ')' after the metric name of {field}(…)")
            summary = (field.lower(), _text(metric))
        op = self.take()
        if op.kind != "op":
            raise QuerySyntaxError(op.position, f"expected an operator ({' '.join(OPS)}) after {field!r}")
        symbol = "=" if op.text == "==" else op.text
        value_token = self.take()
        if value_token.kind not in ("word", "string", "number") or value_token.keyword:
            raise QuerySyntaxError(value_token.position, f"expected a value after {op.text!r}")
        value = _value(value_token)
        if summary is not None:
            return self.summary_q(summary, symbol, value, value_token)
        if field == "tag":
            return self.tag_q(symbol, value, value_token)
        if field in TEXT_FIELDS:
            if symbol in ORDERED:
                raise QuerySyntaxError(op.position, f"{field} is text: compare it with =, !=, ~ or !~")
            if field == "status" and symbol in ("=", "!=") and value not in {s for s, _ in Run.STATUSES}:
                statuses = ", ".join(s for s, _ in Run.STATUSES)
                raise QuerySyntaxError(
                    value_token.position, f"status must be one of {statuses} (got {value!r})"
                )
            return _compare(TEXT_FIELDS[field], symbol, str(value))
        if field in NUMBER_FIELDS:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise QuerySyntaxError(
                    value_token.position, f"{field} is a number (got {value_token.text!r})"
                )
            if symbol in ("~", "!~"):
                raise QuerySyntaxError(op.position, f"{field} is a number: compare it with = != < <= > >=")
            return _compare(NUMBER_FIELDS[field], symbol, value)
        return self.config_q(name, symbol, value, op)

    def summary_q(self, summary: tuple[str, str], symbol: str, value: Any, token: Token) -> Q:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise QuerySyntaxError(
                token.position, f"{summary[0]}({summary[1]}) is a number (got {token.text!r})"
            )
        if symbol in ("~", "!~"):
            raise QuerySyntaxError(token.position, "a summary is a number: compare it with = != < <= > >=")
        alias = self.summaries.get(summary)
        if alias is None:
            if len(self.summaries) == MAX_SUMMARIES:
                raise QuerySyntaxError(
                    token.position, f"at most {MAX_SUMMARIES} different summaries in one query"
                )
            alias = self.summaries[summary] = f"query_summary_{len(self.summaries)}"
            self.annotations[alias] = _summary(*summary)
        return _compare(alias, symbol, value)

    def tag_q(self, symbol: str, value: Any, token: Token) -> Q:
        if symbol not in ("=", "!="):
            raise QuerySyntaxError(token.position, "tag is compared with = or != only")
        name = str(value)
        tagged = Q(Exists(RunTag.objects.filter(run=OuterRef("pk"), name=name))) | Q(
            Exists(ExperimentTag.objects.filter(experiment=OuterRef("experiment_id"), name=name))
        )
        return tagged if symbol == "=" else ~tagged

    def config_q(self, name: Token, symbol: str, value: Any, op: Token) -> Q:
        parts = name.text.split(".")
        roots = sorted(RunConfig.model_fields)
        if parts[0] not in RunConfig.model_fields or not all(re.fullmatch(r"[A-Za-z_]\w*", p) for p in parts):
            fields = ", ".join([*NUMBER_FIELDS, *TEXT_FIELDS, "tag"])
            raise QuerySyntaxError(
                name.position,
                f"unknown field {name.text!r}: fields are {fields}; config paths start with one of "
                f"{', '.join(roots)}; summaries are {', '.join(SUMMARIES)}(metric)",
            )
        at = name.position
        for part in parts:
            if part in LOOKUP_NAMES:
                raise QuerySyntaxError(
                    at,
                    f"{part!r} is not a config key: a config path names keys only (algorithm.preset), "
                    f"and the operator compares ({' '.join(OPS)})",
                )
            at += len(part) + 1
        if symbol in ("~", "!~") and not isinstance(value, str):
            raise QuerySyntaxError(op.position, "~ looks for text: give it a string")
        return _compare("config__" + "__".join(parts), symbol, value)


def _text(token: Token) -> str:
    if token.kind == "string":
        return re.sub(r"\\(.)", r"\1", token.text[1:-1])
    return token.text


def _value(token: Token) -> Any:
    if token.kind == "number":
        number = float(token.text)
        if not math.isfinite(number):
            raise QuerySyntaxError(token.position, f"a number is finite (got {token.text!r}, too large)")
        return int(number) if number.is_integer() and re.fullmatch(r"-?\d+", token.text) else number
    if token.kind == "word" and token.text.lower() in ("true", "false"):
        return token.text.lower() == "true"
    return _text(token)


def _compare(path: str, symbol: str, value: Any) -> Q:
    if symbol == "!=":
        return ~Q(**{f"{path}__exact": value})
    if symbol == "!~":
        return ~Q(**{f"{path}__icontains": value})
    return Q(**{f"{path}__{LOOKUP[symbol]}": value})


def _summary(function: str, metric: str) -> Subquery:
    """The run's `function` of metric `metric` over its logged steps (missing values left out)."""
    field = {"last": "last_finite", "first": "first", "min": "min", "max": "max", "mean": "mean"}[function]
    return series.summary(field, metric)


def parse(text: str) -> Parsed:
    """`text` as a filter of runs; a QuerySyntaxError pointing at the first mistake."""
    if len(text) > MAX_LENGTH:
        raise QuerySyntaxError(MAX_LENGTH, f"a query is at most {MAX_LENGTH} characters")
    if "\x00" in text:
        raise QuerySyntaxError(text.index("\x00"), "a query cannot hold NUL")
    return _Parser(text).parse()
