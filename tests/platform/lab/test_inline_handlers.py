"""No template carries an inline event handler (`onclick=`, `onsubmit=`, …) or a `javascript:`
link: the site's CSP (`script-src 'self'`) blocks them all, so one would silently do nothing (a
report's delete confirmation never ran). Behaviour goes in the static scripts."""

from __future__ import annotations

import re

from support import REPO

HANDLER = re.compile(r"<[^>]*\son[a-z]+\s*=", re.IGNORECASE | re.DOTALL)
SCRIPT_LINK = re.compile(r"""(href|action|src)\s*=\s*["']?\s*javascript:""", re.IGNORECASE)


def test_no_template_has_an_inline_handler_or_a_javascript_link():
    templates = sorted((REPO / "templates").rglob("*.html")) + sorted(
        (REPO / "platform").rglob("templates/**/*.html")
    )
    assert len(templates) > 20, "the templates were found"
    found = [
        f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}"
        for path in templates
        for text in [path.read_text()]
        for pattern in (HANDLER, SCRIPT_LINK)
        for m in pattern.finditer(text)
    ]
    assert found == []
