"""The ASGI app serves the page's static files itself, with DEBUG on as well as off (no proxy, no CDN)."""

from __future__ import annotations

import urllib.request

import pytest

from .server import GatewayServer


@pytest.mark.server
@pytest.mark.parametrize("debug", ["True", "False"])
def test_static_files_are_served_by_the_app(debug: str) -> None:
    server = GatewayServer(extra_env={"DEBUG": debug})
    try:
        server.prepare()
        server.start()
        for name, kind in (("app.js", "javascript"), ("state.js", "javascript"), ("app.css", "text/css")):
            with urllib.request.urlopen(f"{server.base_url}/static/chat/{name}", timeout=5) as res:
                assert res.status == 200, name
                assert kind in res.headers["content-type"], (name, res.headers["content-type"])
        with urllib.request.urlopen(f"{server.base_url}/login/", timeout=5) as res:
            page = res.read().decode()
        assert "/static/chat/app.css" in page
        assert "http://" not in page.replace(server.base_url, "") and "https://" not in page
    finally:
        server.cleanup()
