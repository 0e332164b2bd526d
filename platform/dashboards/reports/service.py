"""Reports: a page of Markdown prose with blocks, each a line of its own that embeds a comparison
chart, a summary table or a claim by its permalink:

    {{ chart /experiments/3/compare/?metric=eval/accuracy&x=step }}
    {{ table /compare/?runs=11,12,13&rule=mean_last_k&k=5 }}
    {{ claim /claims/7/ }}

The prose is rendered by markdown-it with raw HTML off, then sanitised (nh3): no script, event
attribute or `javascript:` link survives. Publishing freezes the report into a new version: each
block's link, query, run ids and computed numbers (the comparison payload, with the statistics'
method, reps and seed; a claim's verdict and tests) are stored, so a version reads the same after
runs are added, retried or archived; `current` sets them beside what the links give now. A block
cites only its report's team's runs and claims; the runs a version cites cannot be deleted."""

from __future__ import annotations

import csv
import io
import re
import zipfile
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import nh3
from django.db import transaction
from django.http import QueryDict
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

from dashboards.claims import service as claim_service
from dashboards.comparison import compare, export, query
from dashboards.models import Claim, Report, ReportRun, ReportVersion
from experiments.models import Experiment, Run
from lab.errors import FieldError

KINDS = ("chart", "table", "claim")
MAX_SOURCE = 100_000
MAX_BLOCKS = 20
BLOCK = re.compile(r"^\s*\{\{\s*(?P<kind>[a-z]+)\s+(?P<link>\S+)\s*\}\}\s*$")
EXPERIMENT_LINK = re.compile(r"^/experiments/(\d+)/compare/?$")
SELECTION_LINK = re.compile(r"^/compare/?$")
CLAIM_LINK = re.compile(r"^/claims/(\d+)/?$")

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


class ReportError(FieldError):
    """What is wrong with a report's field (`source`: with the line of the block)."""


@dataclass(frozen=True)
class Block:
    kind: str
    link: str
    line: int


def _image_as_link(renderer, tokens, idx, options, env) -> str:
    image = tokens[idx]
    alt = renderer.renderInlineAsText(image.children or [], options, env) or image.attrGet("src")
    return f'<a href="{escapeHtml(image.attrGet("src") or "")}">{escapeHtml(alt)}</a>'


# An exported report is opened from disk, where an image from another host would tell that host who
# read it and when: there an image is a link to it, and no img element is kept.
_markdown_without_images = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
_markdown_without_images.add_render_rule("image", _image_as_link)


def prose_html(text: str, images: bool = True) -> str:
    """Markdown as sanitised HTML: raw HTML is shown as text, links keep http(s) and mailto only;
    without `images`, each image is a link to it (alt text)."""
    return nh3.clean(
        (_markdown if images else _markdown_without_images).render(text),
        tags=None if images else nh3.ALLOWED_TAGS - {"img"},
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )


def parse(source: str) -> list[str | Block]:
    """The source as prose chunks and blocks in order; a ReportError names the line of a mistake."""
    if len(source) > MAX_SOURCE:
        raise ReportError("source", f"a report is at most {MAX_SOURCE:,} characters (got {len(source):,})")
    if "\x00" in source:
        raise ReportError("source", "a report cannot contain NUL characters")
    parts: list[str | Block] = []
    prose: list[str] = []
    fenced = False
    for number, line in enumerate(source.splitlines(), start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        found = None if fenced else BLOCK.match(line)
        if found is None:
            prose.append(line)
            continue
        kind, link = found["kind"], found["link"]
        if kind not in KINDS:
            raise ReportError("source", f"line {number}: a block is one of {', '.join(KINDS)} (got {kind!r})")
        split = _split(link, number)  # a page's full address or its path: kept as the path and query
        link = split.path + (f"?{split.query}" if split.query else "")
        _target(kind, link, number)  # the link's shape, checked now
        if prose:
            parts.append("\n".join(prose))
            prose = []
        parts.append(Block(kind, link, number))
    if prose:
        parts.append("\n".join(prose))
    if sum(isinstance(p, Block) for p in parts) > MAX_BLOCKS:
        raise ReportError("source", f"a report has at most {MAX_BLOCKS} blocks")
    return parts


def _split(link: str, line: int) -> SplitResult:
    try:
        return urlsplit(link)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL": a host that opens [ and never closes it
        raise ReportError("source", f"line {line}: {link!r} is not a link ({exc})") from exc


def _target(kind: str, link: str, line: int) -> tuple[str, int | list[int] | None, QueryDict]:
    """What a block's link names: ("experiment", id, query), ("runs", ids, query) or ("claim", id, {})."""
    split = _split(link, line)
    params = QueryDict(split.query)
    where = f"line {line}: "
    if kind == "claim":
        found = CLAIM_LINK.match(split.path)
        if found is None:
            raise ReportError(
                "source", where + f"a claim block links a claim's page, /claims/ID/ (got {link!r})"
            )
        return "claim", int(found[1]), params
    if found := EXPERIMENT_LINK.match(split.path):
        target: tuple[str, Any] = ("experiment", int(found[1]))
    elif SELECTION_LINK.match(split.path):
        try:
            target = ("runs", query.parse_run_ids(params))
        except query.QueryError as exc:
            raise ReportError("source", where + exc.message) from exc
    else:
        raise ReportError(
            "source",
            where + f"a {kind} block links a comparison, /experiments/ID/compare/?… or /compare/?runs=… "
            f"(got {link!r})",
        )
    try:
        query.ComparisonQuery.parse(params)
    except query.QueryError as exc:
        raise ReportError("source", where + exc.message) from exc
    return target[0], target[1], params


def compute(team, block: Block) -> dict[str, Any]:
    """The block's data now, from its team's runs and claims only: what publishing freezes."""
    what, ident, params = _target(block.kind, block.link, block.line)
    where = f"line {block.line}: "
    frozen: dict[str, Any] = {"kind": block.kind, "link": block.link, "line": block.line}
    if what == "claim":
        claim = Claim.objects.filter(team=team, pk=ident).select_related("author", "team").first()
        if claim is None:
            raise ReportError("source", where + f"no claim {ident} in team {team}")
        runs = list(claim.runs().select_related("experiment"))
        return frozen | {
            "claim": claim_service.as_dict(claim, claim_service.result(claim, runs)),
            "run_ids": sorted(run.pk for run in runs),
        }
    team_runs = Run.objects.filter(experiment__team=team)
    if what == "experiment":
        if not Experiment.objects.filter(team=team, pk=ident).exists():
            raise ReportError("source", where + f"no experiment {ident} in team {team}")
        runs = team_runs.filter(experiment_id=ident)
        frozen["target"] = {"experiment": ident}
    else:
        try:
            runs = query.selected_runs(team_runs, ident)
        except query.QueryError as exc:
            raise ReportError("source", where + exc.message.replace("your teams", f"team {team}")) from exc
        frozen["target"] = {"runs": ident}
    asked = query.ComparisonQuery.parse(params)
    payload = compare.compare(
        runs, asked, compare.TABLE_PANELS if block.kind == "table" else compare.ALL_PANELS
    )
    frozen["query"] = {name: params.get(name) for name in params}
    frozen["run_ids"] = sorted(row["id"] for row in payload["runs"])
    frozen["data"] = payload
    return frozen


def compute_all(team, source: str) -> list[dict[str, Any]]:
    return [compute(team, part) for part in parse(source) if isinstance(part, Block)]


def parts(source: str, blocks: list[dict[str, Any]], images: bool = True) -> list[dict[str, Any]]:
    """The page in order: {"html": sanitised prose (`prose_html`)} and {"block": data, "index": i},
    with the data of each block from `blocks` (frozen or current; a block that failed is {"error": …})."""
    out: list[dict[str, Any]] = []
    index = 0
    for part in parse(source):
        if isinstance(part, Block):
            out.append({"block": blocks[index], "index": index})
            index += 1
        else:
            out.append({"html": prose_html(part, images)})
    return out


def may_edit(user, report: Report) -> bool:
    """Its author or an admin of its team (`Team.is_admin`)."""
    return report.author_id == user.pk or report.team.is_admin(user)


def save(report: Report, title: str | None, source: str | None) -> Report:
    """Change the draft; the blocks' shapes are checked (a ReportError) before anything is saved."""
    if title is not None:
        report.title = check_title(title)
    if source is not None:
        parse(source)
        report.source = source
    report.save()
    return report


def check_title(title: str) -> str:
    title = title.strip()
    if not 0 < len(title) <= 300 or "\x00" in title:
        raise ReportError("title", "a report's title is 1 to 300 characters")
    return title


def publish(report: Report, user) -> ReportVersion:
    """Freeze the draft as the report's next version, citing every run its blocks rest on."""
    blocks = compute_all(report.team, report.source)
    with transaction.atomic():
        Report.objects.select_for_update().filter(pk=report.pk).first()
        latest = report.latest()
        version = ReportVersion.objects.create(
            report=report,
            number=(latest.number if latest else 0) + 1,
            title=report.title,
            source=report.source,
            blocks=blocks,
            author=user,
        )
        cited = sorted({pk for block in blocks for pk in block["run_ids"]})
        present = set(Run.objects.filter(pk__in=cited).values_list("pk", flat=True))
        ReportRun.objects.bulk_create(
            [ReportRun(version=version, run_id=pk) for pk in cited if pk in present]
        )
    return version


def _cells(block: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    return {(row["experiment"], row["line"], row["staleness"]): row for row in block["data"]["summary"]}


def difference(then: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """What changed in one block since it was frozen: runs added and gone (archived or deleted),
    and each summary cell's or the claim's numbers then and now (with the notes of runs left out
    now for a damaged chunk, `damaged`)."""
    out: dict[str, Any] = {"kind": then["kind"], "link": then["link"], "line": then["line"]}
    if "error" in now:
        return out | {"error": now["error"], "changed": True}
    before, after = set(then["run_ids"]), set(now["run_ids"])
    gone = sorted(before - after)
    archived = set(Run.objects.filter(pk__in=gone).exclude(archived=None).values_list("pk", flat=True))
    out |= {
        "added": sorted(after - before),
        "archived": [pk for pk in gone if pk in archived],
        "deleted": [pk for pk in gone if pk not in archived],
    }
    if then["kind"] == "claim":
        a, b = then["claim"], now["claim"]
        rows = [
            {"setting": x["setting"], "then": x["verdict"], "now": y["verdict"]}
            for x, y in zip(a["by_setting"], b["by_setting"], strict=False)
        ]
        out |= {"verdict_then": a["verdict"], "verdict_now": b["verdict"], "settings": rows}
        changed = a["verdict"] != b["verdict"] or any(r["then"] != r["now"] for r in rows)
    else:
        old, new = _cells(then), _cells(now)
        rows = []
        for key in [*old, *(k for k in new if k not in old)]:
            x, y = old.get(key), new.get(key)
            fields = ("value", "lo", "hi", "n_seeds")
            rows.append(
                {
                    "line": key[1],
                    "staleness": key[2],
                    "then": None if x is None else {f: x[f] for f in fields},
                    "now": None if y is None else {f: y[f] for f in fields},
                    "changed": x is None or y is None or any(x[f] != y[f] for f in fields),
                }
            )
        out["cells"] = rows
        out["damaged"] = now["data"].get("damaged", [])
        changed = any(row["changed"] for row in rows)
    out["changed"] = bool(changed or out["added"] or gone)
    return out


def current(version: ReportVersion) -> list[dict[str, Any]]:
    """Each frozen block of `version` beside what its link gives now."""
    team = version.report.team
    out = []
    for then in version.blocks:
        try:
            now = compute(team, Block(then["kind"], then["link"], then["line"]))
        except ReportError as exc:
            now = {"error": exc.message}
        out.append(difference(then, now))
    return out


def csv_bundle(version: ReportVersion) -> bytes:
    """A zip of CSV files: the blocks with the runs they cite, and each block's numbers (a table's
    summary, a chart's curves and summary, a claim's tests)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        rows = io.StringIO()
        writer = csv.writer(rows)
        writer.writerow(["block", "kind", "link", "runs"])
        for i, block in enumerate(version.blocks, start=1):
            writer.writerow([i, block["kind"], block["link"], " ".join(map(str, block["run_ids"]))])
            name = f"block-{i}-{block['kind']}"
            if block["kind"] == "claim":
                bundle.writestr(f"{name}.csv", _claim_csv(block["claim"]))
                continue
            bundle.writestr(f"{name}-summary.csv", export.summary_csv(block["data"]))
            if "groups" in block["data"]:
                bundle.writestr(f"{name}-curves.csv", export.curves_csv(block["data"]))
            bundle.writestr(f"{name}-runs.csv", _runs_csv(block["data"]["runs"]))
        bundle.writestr("blocks.csv", rows.getvalue())
    return buffer.getvalue()


def _runs_csv(runs: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    columns = ["id", "experiment", "line", "staleness", "seed", "status", "final"]
    writer.writerow(columns)
    for row in runs:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    return out.getvalue()


def _claim_csv(claim: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    columns = [
        "a",
        "b",
        "verdict",
        "test",
        "estimate",
        "lo",
        "hi",
        "n",
        "paired",
        "p_support",
        "p_contradict",
    ]
    writer.writerow(["claim", "statement", "setting", *columns])
    for entry in claim["by_setting"]:
        for row in entry["parts"]:
            values = ["" if row.get(c) is None else row.get(c) for c in columns]
            writer.writerow([claim["id"], claim["statement"], entry["setting"], *values])
    return out.getvalue()
