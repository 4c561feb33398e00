"""The local web's HTTP server (aiohttp): every site, the search engine and its API.

Routes:
  /                                  the search engine's home page
  /search?q=&page=N                  results a browser sees, 10 a page
  /api/search?q=&k=10[&site=geo]     {"results": [{"url", "title", "snippet"}]}
  /{site}/search?q=&page=N           one site's own search box
  /geo/country/{ISO}/cities?page=N   a paginated list ("Next page" links)
  /airports/country/{ISO}?page=N     another one
  /airports/api/{IATA}.json          data behind a JavaScript-rendered panel
  /elements/api/{symbol}.json        another one
  /members/login, /members/logout    a login form and a session cookie
  /members/, /members/notes/{ISO}    pages behind the login wall
  /docs/...                          the Python documentation, served from disk
  /health                            "ok"
  anything else                      a static page, or a 404 page
"""

from __future__ import annotations

import secrets
from urllib.parse import quote

from aiohttp import web

from rollout.web import pydocs
from rollout.web.build import LocalWeb
from rollout.web.site import number
from rollout.web.templates import DETAILS_JS, FILTER_JS, STYLES

RESULTS_PER_PAGE = 10
SESSION_COOKIE = "session"
USERS = {"reader": "factbook"}  # the demo account the login page shows
SEARCHABLE_SITES = ("geo", "factbook", "airports", "elements", "docs")
WEB_KEY = web.AppKey("web", LocalWeb)
SESSIONS_KEY = web.AppKey("sessions", dict)


def html_response(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


def _page_number(request: web.Request) -> int:
    try:
        return max(1, int(request.query.get("page", "1")))
    except ValueError:
        return 1


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def api_search(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    q = request.query.get("q", "")
    try:
        k = min(max(int(request.query.get("k", "10")), 1), 100)
    except ValueError:
        return web.json_response({"error": "k must be an integer"}, status=400)
    site = request.query.get("site") or None
    if site is not None and site not in SEARCHABLE_SITES:
        return web.json_response({"error": f"site must be one of {SEARCHABLE_SITES}"}, status=400)
    results = lw.index.search(q, k=k, site=site)
    return web.json_response({"query": q, "results": [r.as_json() for r in results]})


def _results_page(request: web.Request, site: str | None) -> web.Response:
    lw = request.app[WEB_KEY]
    q = request.query.get("q", "").strip()
    page = _page_number(request)
    start = (page - 1) * RESULTS_PER_PAGE
    results = lw.index.search(q, k=RESULTS_PER_PAGE + 1, offset=start, site=site) if q else []
    action = "/search" if site is None else f"/{site}/search"
    more = len(results) > RESULTS_PER_PAGE
    base = f"{action}?q={quote(q)}&page="
    body = lw.site.render(
        "results",
        site or "search",
        f"Results for {q}",
        [("/", "Seek"), ("", "Search")],
        q=q,
        action=action,
        results=results[:RESULTS_PER_PAGE],
        start=start + 1,
        page=page,
        prev=f"{base}{page - 1}" if page > 1 else None,
        next=f"{base}{page + 1}" if more else None,
    )
    return html_response(body)


async def search_page(request: web.Request) -> web.Response:
    return _results_page(request, None)


async def site_search_page(request: web.Request) -> web.Response:
    site = request.match_info["site"]
    if site not in SEARCHABLE_SITES:
        raise web.HTTPNotFound()
    return _results_page(request, site)


async def paginated(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    kind = "cities" if request.path.startswith("/geo/") else "airports"
    body = lw.site.paginated(kind, request.match_info["iso"], _page_number(request))
    return html_response(body) if body is not None else await not_found(request)


async def details(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    key = request.match_info["key"]
    data = (
        lw.site.airport_details(key)
        if request.path.startswith("/airports/")
        else lw.site.element_details(key)
    )
    if data is None:
        return web.json_response({"error": "not found"}, status=404)
    return web.json_response(data)


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name == "details.js" or name == "filter.js":
        js = DETAILS_JS if name == "details.js" else FILTER_JS
        return web.Response(text=js, content_type="application/javascript")
    site = name.removesuffix(".css")
    if name.endswith(".css") and site in STYLES:
        return web.Response(text=STYLES[site], content_type="text/css")
    raise web.HTTPNotFound()


async def docs(request: web.Request) -> web.StreamResponse:
    rel = request.match_info["path"] or "index.html"
    root = pydocs.DOCS_ROOT.resolve()
    target = (root / rel).resolve()
    if not target.is_relative_to(root):  # no way out of the documentation tree
        raise web.HTTPNotFound()
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return await not_found(request)
    return web.FileResponse(target)


# ---------------------------------------------------------------------- members


def _user(request: web.Request) -> str | None:
    token = request.cookies.get(SESSION_COOKIE)
    return request.app[SESSIONS_KEY].get(token) if token else None


def _safe_next(value: str) -> str:
    """Only local paths: no open redirect through ``next``."""
    if value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/members/"


async def login_form(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    nxt = _safe_next(request.query.get("next", "/members/"))
    body = lw.site.render(
        "login", "members", "Sign in", [("/", "Seek"), ("", "Sign in")], error="", next=nxt
    )
    return html_response(body)


async def login(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    form = await request.post()
    user, password = str(form.get("username", "")), str(form.get("password", ""))
    nxt = _safe_next(str(form.get("next", "/members/")))
    if USERS.get(user) != password or not user:
        body = lw.site.render(
            "login",
            "members",
            "Sign in",
            [("/", "Seek"), ("", "Sign in")],
            error="Wrong user name or password.",
            next=nxt,
        )
        return html_response(body, status=401)
    token = secrets.token_hex(16)
    request.app[SESSIONS_KEY][token] = user
    response = web.HTTPSeeOther(nxt)
    response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="Lax", path="/")
    raise response


async def logout(request: web.Request) -> web.Response:
    token = request.cookies.get(SESSION_COOKIE)
    request.app[SESSIONS_KEY].pop(token, None)
    response = web.HTTPSeeOther("/members/login")
    response.del_cookie(SESSION_COOKIE, path="/")
    raise response


def _wall(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    body = lw.site.render(
        "wall", "members", "Members only", [("/", "Seek"), ("", "Members")], next=request.path_qs
    )
    return html_response(body, status=401)


async def members_index(request: web.Request) -> web.Response:
    user = _user(request)
    if user is None:
        return _wall(request)
    lw = request.app[WEB_KEY]
    countries = sorted(lw.world.countries.values(), key=lambda c: c.name)
    items = [(f"/members/notes/{c.iso}", c.name, c.continent) for c in countries]
    body = lw.site.render(
        "index",
        "members",
        "Editors' notes",
        [("/", "Seek"), ("", "Members")],
        heading="Editors' notes",
        intro=f"Signed in as {user}. Notes on {len(items)} countries.",
        filters=[],
        items=items,
        list_class="notes",
    )
    return html_response(body)


async def members_note(request: web.Request) -> web.Response:
    user = _user(request)
    if user is None:
        return _wall(request)
    lw = request.app[WEB_KEY]
    c = lw.world.countries.get(request.match_info["iso"])
    if c is None:
        return await not_found(request)
    fb = (c.factbook or {}).get("People and Society", {}).get("Population", {})
    fb_total = fb.get("total") if isinstance(fb, dict) else fb
    note = f"Population sources for {c.name}: the Atlas lists {number(c.population)} (GeoNames)"
    note += (
        f"; the World Factbook lists {fb_total}."
        if fb_total
        else "; the World Factbook lists none."
    )
    body = lw.site.render(
        "notes", "members", f"Notes: {c.name}", [("/", "Seek"), ("/members/", "Members"), ("", c.name)],
        c=c, user=user, note=note,
    )  # fmt: skip
    return html_response(body)


# ---------------------------------------------------------------------- pages


async def not_found(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    body = lw.site.render(
        "index",
        "search",
        "Not found",
        [("/", "Seek"), ("", "Not found")],
        heading="Page not found",
        intro=f"There is no page at {request.path}.",
        filters=[],
        items=[],
        list_class="none",
    )
    return html_response(body, status=404)


async def page(request: web.Request) -> web.Response:
    lw = request.app[WEB_KEY]
    path = request.path
    p = lw.site.pages.get(path) or lw.site.pages.get(path.rstrip("/") + "/")
    if p is None:
        return await not_found(request)
    return html_response(p.html)


def make_app(lw: LocalWeb) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[WEB_KEY] = lw
    app[SESSIONS_KEY] = {}
    r = app.router
    r.add_get("/health", health)
    r.add_get("/api/search", api_search)
    r.add_get("/search", search_page)
    r.add_get("/static/{name}", static)
    r.add_get("/docs/{path:.*}", docs)
    r.add_get("/members/login", login_form)
    r.add_post("/members/login", login)
    r.add_get("/members/logout", logout)
    r.add_get("/members/", members_index)
    r.add_get("/members/notes/{iso}", members_note)
    r.add_get("/geo/country/{iso}/cities", paginated)
    r.add_get("/airports/country/{iso}", paginated)
    r.add_get("/airports/api/{key}.json", details)
    r.add_get("/elements/api/{key}.json", details)
    r.add_get("/{site}/search", site_search_page)
    r.add_get("/{tail:.*}", page)
    return app
