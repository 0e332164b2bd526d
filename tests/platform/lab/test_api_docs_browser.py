"""/api/docs in a real browser: Swagger UI renders from our own static files, and the page
makes no request that leaves this machine (it works offline)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_api_docs_render_with_no_request_off_this_machine(page, live_server):
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))

    page.goto(live_server.url + "/api/docs")
    operation = page.locator(".opblock-summary-path", has_text="/api/experiments/{experiment_id}/cancel")
    operation.first.wait_for(state="visible")
    assert page.locator(".opblock").count() >= 10

    page.wait_for_load_state("networkidle")
    server = urlsplit(live_server.url).hostname
    assert server in ("127.0.0.1", "localhost")
    assert {urlsplit(url).hostname for url in requested} == {server}, requested
    assert any(url.endswith("/static/ninja/swagger-ui-bundle.js") for url in requested), requested
    assert any(url.endswith("/api/openapi.json") for url in requested), requested
