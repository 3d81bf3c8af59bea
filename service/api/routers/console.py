"""The web console's pages, /docs and /redoc: HTML shells whose scripts are files of the package.

Every script and style comes from ``service/api/static`` (no CDN), so the console and the API
docs work offline. Console pages get a CSP without inline scripts; /docs and /redoc need one
inline bootstrap script each, allowed by its hash and by nothing else.
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from pathlib import Path

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from service.core.diagnosis import (
    CAUSE_FIX,
    CAUSE_MEANING,
    CAUSES,
    STATE_MEANING,
    STATES,
    WASTE_CAUSES,
    WASTE_STATES,
    causes_of_state,
)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
STATIC_PREFIX = "/static"

router = APIRouter(include_in_schema=False)

_COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
    "Cache-Control": "no-store",
}
CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)


def _docs_csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    # Swagger UI and ReDoc set style attributes and inject <style> elements at run time;
    # scripts stay limited to our files and the one bootstrap script below.
    return (
        f"default-src 'none'; script-src 'self' 'sha256-{digest}'; "
        "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
        "connect-src 'self'; worker-src 'self' blob:; frame-ancestors 'none'; base-uri 'none'"
    )


def _page(html: str, csp: str) -> HTMLResponse:
    return HTMLResponse(html, headers={**_COMMON_HEADERS, "Content-Security-Policy": csp})


@cache
def _shell() -> str:
    return (STATIC_DIR / "console" / "index.html").read_text()


def console_page() -> HTMLResponse:
    """The console's one HTML shell; console.js draws the page the path names."""
    return _page(_shell(), CONSOLE_CSP)


router.add_api_route("/alerts", console_page, methods=["GET"], response_class=HTMLResponse)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(
    since: str | None = Query(None, description="the jobs page's range (24h, 7d or 30d)"),
) -> HTMLResponse:
    """The jobs page (the shell; the script reads the range from the URL)."""
    return console_page()


@router.get("/costs", response_class=HTMLResponse)
def costs_page(
    group_by: str | None = Query(None, description="the costs page's grouping"),
    start: str | None = Query(None, description="its range's start"),
    end: str | None = Query(None, description="its range's end"),
) -> HTMLResponse:
    """The costs page (the shell; the script reads the grouping and range from the URL, so
    a reload keeps them and a link shares them)."""
    return console_page()


@router.get("/actions", response_class=HTMLResponse)
def actions_page(
    policy: str | None = Query(None, description="the actions page's policy filter"),
    outcome: str | None = Query(None, description="its outcome filter (e.g. reclaimed)"),
    user: str | None = Query(None, description="its user filter"),
    team: str | None = Query(None, description="its team filter"),
    job: str | None = Query(None, description="its job filter"),
    since: str | None = Query(None, description="its range (24h, 7d or 30d)"),
) -> HTMLResponse:
    """The ladders' audit log page (the shell; the script reads the filters from the URL)."""
    return console_page()


# Paths that are not the console's pages: their 404 stays the JSON error of the API.
_NOT_CONSOLE = ("/api/", "/static/", "/console/", "/metrics", "/healthz", "/readyz", "/openapi")


def is_console_path(path: str) -> bool:
    """Whether an unknown ``path`` is one a browser asked the console for (its 404 is a page)."""
    return not path.startswith(_NOT_CONSOLE)


def not_found_page() -> HTMLResponse:
    """The console's shell answering 404: the script draws "page not found" with the nav."""
    response = console_page()
    response.status_code = 404
    return response


@router.get("/", response_class=HTMLResponse)
def fleet_page(
    node: str | None = Query(None, description="the fleet page's node filter"),
    model: str | None = Query(None, description="its GPU model filter"),
    team: str | None = Query(None, description="its team filter"),
    state: str | None = Query(None, description="its state filter (e.g. underused)"),
    cause: str | None = Query(None, description="its cause filter (e.g. transfer_bound)"),
) -> HTMLResponse:
    """The fleet page (the shell; the script reads the filters from the URL, so a filtered
    view can be shared as a link)."""
    return console_page()


@router.get("/login", response_class=HTMLResponse)
def login_page(
    next: str | None = Query(None, description="the console path to open after logging in"),
) -> HTMLResponse:
    """The login page (the shell; the script draws the form and follows ``next``)."""
    return console_page()


@router.get("/jobs/{job_id:path}", response_class=HTMLResponse)
def job_page(job_id: str) -> HTMLResponse:
    """A job's page (the shell; the script reads the id from the path)."""
    return console_page()


def owner_page(
    name: str,
    start: str | None = Query(None, description="the page's range's start"),
    end: str | None = Query(None, description="its range's end"),
) -> HTMLResponse:
    """A user's or a team's own page: their GPUs now, jobs and waste (the shell; the script
    reads the name from the path and the range from the URL, as the periodic report's link
    sets it)."""
    return console_page()


for _owners in ("users", "teams"):
    router.add_api_route(
        f"/{_owners}/{{name:path}}", owner_page, methods=["GET"], response_class=HTMLResponse
    )


@router.get("/console/sso.json")
def sso(request: Request) -> JSONResponse:
    """Whether single sign-on is set up (the login page then offers it)."""
    return JSONResponse(
        {"enabled": getattr(request.app.state, "oidc", None) is not None},
        headers={"Cache-Control": "no-store"},
    )


@router.get("/console/causes.json")
def causes() -> JSONResponse:
    """The causes in their canonical order, with what each means, its fix and whether it is
    waste."""
    waste = set(WASTE_CAUSES)
    return JSONResponse(
        [
            {
                "name": c.label,
                "meaning": CAUSE_MEANING[c],
                "fix": CAUSE_FIX.get(c),
                "waste": c in waste,
            }
            for c in CAUSES
        ],
        headers={"Cache-Control": "max-age=3600"},
    )


@router.get("/console/states.json")
def states() -> JSONResponse:
    """The GPU states worst first, with what each means, the causes in it and whether a GPU
    in it is wasting its cost (the console's chips, cards and filters)."""
    return JSONResponse(
        [
            {
                "name": state.value,
                "meaning": STATE_MEANING[state],
                "causes": [c.label for c in causes_of_state(state)],
                "waste": state in WASTE_STATES,
            }
            for state in STATES
        ],
        headers={"Cache-Control": "max-age=3600"},
    )


_SWAGGER_BOOT = (
    "window.ui = SwaggerUIBundle({url: '/openapi.json', dom_id: '#swagger-ui', "
    "deepLinking: true, presets: [SwaggerUIBundle.presets.apis], layout: 'BaseLayout'});"
)
_REDOC_BOOT = "Redoc.init('/openapi.json', {}, document.getElementById('redoc'));"


def _docs_html(title: str, head: str, body: str, script: str) -> str:
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{title}</title>"
        f"<link rel='icon' href='{STATIC_PREFIX}/console/favicon.svg'>{head}</head>"
        f"<body>{body}<script>{script}</script></body></html>\n"
    )


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui() -> HTMLResponse:
    """Swagger UI on the service's own copy of swagger-ui-dist."""
    html = _docs_html(
        "GPU Warden API (Swagger UI)",
        f"<link rel='stylesheet' href='{STATIC_PREFIX}/vendor/swagger-ui/swagger-ui.css'>",
        "<div id='swagger-ui'></div>"
        f"<script src='{STATIC_PREFIX}/vendor/swagger-ui/swagger-ui-bundle.js'></script>",
        _SWAGGER_BOOT,
    )
    return _page(html, _docs_csp(_SWAGGER_BOOT))


@router.get("/redoc", response_class=HTMLResponse)
def redoc() -> HTMLResponse:
    """ReDoc on the service's own copy of the redoc standalone bundle."""
    html = _docs_html(
        "GPU Warden API (ReDoc)",
        "",
        "<div id='redoc'></div>"
        f"<script src='{STATIC_PREFIX}/vendor/redoc/redoc.standalone.js'></script>",
        _REDOC_BOOT,
    )
    return _page(html, _docs_csp(_REDOC_BOOT))
