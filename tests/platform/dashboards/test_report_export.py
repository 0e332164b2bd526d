"""A report's HTML export is opened from disk, where no header protects it: its own
Content-Security-Policy `<meta>` lets it run only its inline scripts (by hash), load images only
from data: URLs and fetch nothing; its prose's images are links to them, never img elements; and
a chart's metric name reaches Plotly as data, escaped by the script (test_report_export_browser.py
draws it)."""

from __future__ import annotations

import base64
import hashlib
from html.parser import HTMLParser

import pytest
from dashboard_helpers import PIXEL
from django.urls import reverse

pytestmark = pytest.mark.django_db


class Page(HTMLParser):
    """The policy of the first Content-Security-Policy meta, every inline script's text, every element."""

    def __init__(self, html: str):
        super().__init__()
        self.policy, self.scripts, self.elements, self._script = None, [], [], None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag == "meta" and attrs.get("http-equiv", "").lower() == "content-security-policy":
            self.policy = self.policy or attrs["content"]
        if tag == "script":
            self._script = [] if "type" not in attrs else None

    def handle_data(self, data):
        if self._script is not None:
            self._script.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append("".join(self._script))
            self._script = None


def sha256(text: str) -> str:
    return f"'sha256-{base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()}'"


def test_the_export_carries_a_policy_that_runs_its_own_scripts_and_loads_nothing(
    alice_client, hostile_report
):
    answer = alice_client.get(reverse("report-export-html", args=[hostile_report.pk]))
    assert answer.status_code == 200
    html = answer.content.decode()
    page = Page(html)
    directives = dict(d.strip().split(" ", 1) for d in page.policy.split(";"))
    assert set(page.scripts) and directives.pop("script-src").split() == [sha256(s) for s in page.scripts]
    assert len(page.scripts) == 3, "Plotly, plots.js and report.js; the charts' data is JSON, not run"
    assert directives == {
        "default-src": "'none'",
        "style-src": "'unsafe-inline'",
        "img-src": "data:",
        "connect-src": "'none'",
        "base-uri": "'none'",
        "form-action": "'none'",
    }
    tags = [tag for tag, _ in page.elements]
    assert tags.index("meta", tags.index("meta") + 1) < tags.index("style"), "the policy precedes what loads"
    # The image is a link to it, and no element of the page loads anything from a URL.
    assert "img" not in tags
    assert ("a", {"href": PIXEL, "rel": "noopener noreferrer nofollow"}) in page.elements
    assert not [attrs for _, attrs in page.elements if "src" in attrs]


def test_the_site_keeps_the_prose_image_its_own_policy_blocks(alice_client, hostile_report):
    """On the site the page's CSP header (img-src 'self') keeps the image from loading: only the
    export, which has no header, turns it into a link."""
    answer = alice_client.get(reverse("report-detail", args=[hostile_report.pk]))
    assert "img-src 'self' data: blob:" in answer["Content-Security-Policy"]
    assert ("img", {"src": PIXEL, "alt": "a pixel"}) in Page(answer.content.decode()).elements
