"""The local web over real HTTP and in a real Chromium: JS content, pagination, login."""

import re

import aiohttp
import pytest

pytestmark = pytest.mark.multiprocess


async def fetch(url: str, **kw) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url, **kw) as r:
        return r.status, await r.text()


async def test_health_home_and_sites(web_url):
    assert await fetch(f"{web_url}/health") == (200, "ok")
    for path, marker in [
        ("/", "Search every site of the local web"),
        ("/geo/", "Atlas of the world"),
        ("/factbook/", "The World Factbook"),
        ("/airports/", "AirportDB"),
        ("/elements/", "Periodic table of the elements"),
        ("/docs/index.html", "Python 3.11"),
        ("/geo/country/FR", "The capital of France is Paris."),
    ]:
        status, body = await fetch(web_url + path)
        assert status == 200 and marker in body, path


async def test_unknown_pages_and_traversal_are_404(web_url):
    for path in ["/nope", "/geo/country/XX", "/docs/../../etc/passwd", "/docs/%2e%2e/%2e%2e/x"]:
        status, _ = await fetch(web_url + path)
        assert status == 404, path


async def test_search_api_schema_and_site_filter(web_url):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{web_url}/api/search", params={"q": "Paris France", "k": "5"}) as r:
            data = await r.json()
        assert r.status == 200 and len(data["results"]) == 5
        assert all(set(x) == {"url", "title", "snippet"} for x in data["results"])
        params = {"q": "Paris", "k": "10", "site": "airports"}
        async with s.get(f"{web_url}/api/search", params=params) as r:
            data = await r.json()
        assert data["results"] and all(x["url"].startswith("/airports/") for x in data["results"])
        async with s.get(f"{web_url}/api/search", params={"q": "x", "k": "ten"}) as r:
            assert r.status == 400
        async with s.get(f"{web_url}/api/search", params={"q": "x", "site": "evil"}) as r:
            assert r.status == 400


async def test_search_result_pages_paginate(web_url):
    status, page1 = await fetch(f"{web_url}/search?q=airport+Paris")
    assert status == 200 and 'rel="next"' in page1 and "Page 1" in page1
    status, page2 = await fetch(f"{web_url}/search?q=airport+Paris&page=2")
    urls1 = set(re.findall(r'<div class="url">([^<]+)</div>', page1))
    urls2 = set(re.findall(r'<div class="url">([^<]+)</div>', page2))
    assert len(urls1) == len(urls2) == 10 and not urls1 & urls2
    assert 'rel="prev"' in page2


async def test_country_city_list_paginates_over_http(web_url):
    status, first = await fetch(f"{web_url}/geo/country/FR/cities?page=1")
    assert status == 200 and "Page 1 of" in first
    pages = int(re.search(r"Page 1 of (\d+)", first).group(1))
    assert pages > 2
    seen = []
    for n in range(1, pages + 1):
        status, body = await fetch(f"{web_url}/geo/country/FR/cities?page={n}")
        assert status == 200
        seen += re.findall(r'href="/geo/city/(\d+)"', body.split("<main>")[1])
        assert ('rel="next"' in body) == (n < pages)
    assert len(seen) == len(set(seen)) > 2 * 50  # every city once, across the pages
    assert (await fetch(f"{web_url}/geo/country/FR/cities?page={pages + 1}"))[0] == 404


async def test_login_flow_sets_a_session_cookie(web_url):
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for a bare IP host
    async with aiohttp.ClientSession(cookie_jar=jar) as s:
        async with s.get(f"{web_url}/members/notes/FR") as r:
            assert r.status == 401 and "Members only" in await r.text()
        form = {"username": "reader", "password": "wrong", "next": "/members/notes/FR"}
        async with s.post(f"{web_url}/members/login", data=form) as r:
            assert r.status == 401 and "Wrong user name or password" in await r.text()
        assert not [c for c in jar if c.key == "session"]
        form["password"] = "factbook"
        async with s.post(f"{web_url}/members/login", data=form, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/members/notes/FR"
            cookie = r.cookies["session"]
            assert cookie["httponly"] and len(cookie.value) == 32
        async with s.get(f"{web_url}/members/notes/FR") as r:
            text = await r.text()
            assert r.status == 200 and "Population sources for France" in text
        async with s.get(f"{web_url}/members/logout") as r:
            assert r.status == 200  # back on the login form
        async with s.get(f"{web_url}/members/notes/FR") as r:
            assert r.status == 401


async def test_login_refuses_open_redirects(web_url):
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        for nxt in ["//evil.example/", "http://evil.example/", "/\\evil.example"]:
            form = {"username": "reader", "password": "factbook", "next": nxt}
            async with s.post(f"{web_url}/members/login", data=form, allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "/members/"


# ----------------------------------------------------------------------------- in Chromium


@pytest.mark.browser
async def test_js_rendered_content_is_absent_from_raw_html_and_present_after_rendering(
    web_url, browser
):
    _, raw = await fetch(f"{web_url}/airports/CDG")
    assert "Loading details..." in raw and "Elevation" not in raw
    ctx = await browser.new_context()
    try:
        page = await ctx.new_page()
        await page.goto(f"{web_url}/airports/CDG")
        await page.wait_for_selector("#details table")
        text = await page.evaluate("document.body.innerText")
        assert "Elevation" in text and "392 ft" in text and "Loading details" not in text
        await page.goto(f"{web_url}/elements/Fe")
        await page.wait_for_selector("#details table")
        assert "g/cm³" in await page.inner_text("#details")
    finally:
        await ctx.close()


@pytest.mark.browser
async def test_pagination_by_clicking_next_page(web_url, browser):
    ctx = await browser.new_context()
    try:
        page = await ctx.new_page()
        await page.goto(f"{web_url}/airports/country/FR?page=1")
        first = await page.locator("main ol li a").all_inner_texts()
        await page.get_by_role("link", name="Next page").click()
        await page.wait_for_url("**page=2")
        second = await page.locator("main ol li a").all_inner_texts()
        assert len(first) == 50 and second and not set(first) & set(second)
        assert "Page 2 of" in await page.inner_text("nav.pagination")
    finally:
        await ctx.close()


@pytest.mark.browser
async def test_login_in_the_browser_and_the_cookie_it_sets(web_url, browser):
    ctx = await browser.new_context()
    try:
        page = await ctx.new_page()
        await page.goto(f"{web_url}/members/notes/DE")
        assert "Members only" in await page.inner_text("main")
        await page.get_by_role("link", name="Sign in").click()
        await page.fill("input[name=username]", "reader")
        await page.fill("input[name=password]", "factbook")
        await page.click("main form button[type=submit]")
        await page.wait_for_url("**/members/notes/DE")
        assert "Population sources for Germany" in await page.inner_text("main")
        cookies = {c["name"]: c for c in await ctx.cookies()}
        assert cookies["session"]["httpOnly"]
    finally:
        await ctx.close()
    other = await browser.new_context()  # a new context has no session
    try:
        page = await other.new_page()
        await page.goto(f"{web_url}/members/notes/DE")
        assert "Members only" in await page.inner_text("main")
    finally:
        await other.close()


@pytest.mark.browser
async def test_site_search_box_and_many_interactive_elements(web_url, browser):
    ctx = await browser.new_context()
    try:
        page = await ctx.new_page()
        await page.goto(f"{web_url}/elements/")
        assert await page.locator("a, button").count() > 118
        await page.fill("header input[name=q]", "Curie")
        await page.press("header input[name=q]", "Enter")
        await page.wait_for_url("**/elements/search?q=Curie*")
        links = await page.locator("ol.results a").evaluate_all("els => els.map(e => e.href)")
        assert links and all("/elements/" in h for h in links)
        await page.goto(f"{web_url}/factbook/")
        assert await page.locator("main a").count() > 200
    finally:
        await ctx.close()
