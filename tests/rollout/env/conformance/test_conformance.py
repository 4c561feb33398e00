"""Conformance of the browser modes with what a person can do on third-party-style pages.

Each case is a page written in the style of pages found on the web (handlers set as
properties, delegated listeners, custom dropdowns, shadow DOM, iframes, modals,
sticky headers, lazy content...). Its docstring says what a person can do there; the
test checks that an agent can do the same through som mode (numbered elements) and
playwright mode (selectors), by the actions those modes offer and nothing else,
reading only what the observation shows. The pages live in ``pages/``; a few dynamic
routes (a slow page, JSON for lazy content, a navigation target, a form's result, a
generated long log) are served next to them by an aiohttp server on loopback.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from rollout.env import browser_pool, make_env, render
from shared.config import EnvConfig, RolloutConfig, SearchConfig

pytestmark = [pytest.mark.browser, pytest.mark.multiprocess]

PAGES = Path(__file__).parent / "pages"
ACTION_TIMEOUT_S = 5.0
BUDGET = 4000  # observation_chars
MODES = ["som", "playwright"]
LOG_LINES = 2000
MAX_STEPS = 100  # scrolling through the 2,000-line log takes some 60 steps
# what an error about a covered element says, in any of the words one would use
COVERED = re.compile(r"intercept|cover|obscur|on top|overlay|modal|blocked by|behind", re.I)


# ----------------------------------------------------------------------------- the site


def _html(title: str, body: str) -> web.Response:
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>{body}</body></html>"
    return web.Response(text=page, content_type="text/html")


async def _target(request: web.Request) -> web.Response:
    via = html.escape(request.query.get("via", "nowhere"))
    return _html("Target", f"<h1>Target page</h1><p>You arrived via {via}.</p>")


async def _lookup(request: web.Request) -> web.Response:
    await asyncio.sleep(0.8)  # the form's server takes a moment, as servers do
    city = html.escape(request.query.get("city", ""))
    return _html("Forecast", f"<p>Forecast for {city}: sunny, 14 degrees.</p>")


async def _slow(request: web.Request) -> web.StreamResponse:
    """Headers and the page's head at once; the body only after 1.5 s."""
    resp = web.StreamResponse(headers={"Content-Type": "text/html; charset=utf-8"})
    await resp.prepare(request)
    await resp.write(
        b"<!doctype html><html><head><title>Quarterly report</title></head>"
        b"<body><h1>Quarterly report</h1>"
    )
    await asyncio.sleep(1.5)
    rows = "".join(f"<p>Row {i}: region {i} sales were steady.</p>" for i in range(1, 6))
    await resp.write(f"{rows}<p>Report complete: 42 rows.</p></body></html>".encode())
    await resp.write_eof()
    return resp


async def _facts(request: web.Request) -> web.Response:
    await asyncio.sleep(0.3)
    return web.json_response({"fact": "Otters hold hands while they sleep."})


async def _more(request: web.Request) -> web.Response:
    await asyncio.sleep(0.3)
    items = ["Chapter 2: The river delta", "Otters can close their ears and nostrils underwater."]
    return web.json_response({"items": items})


async def _longpre(request: web.Request) -> web.Response:
    """A build log: one <pre> of 2,000 numbered lines (about 80,000 characters)."""
    lines = "\n".join(
        f"line {i:04d}: step {i} compiled, 0 warnings, 0 errors" for i in range(1, LOG_LINES + 1)
    )
    body = (
        "<style>pre { font: 13px/16px monospace; }</style>"
        "<h1>Build log</h1><p>The full output of the nightly build.</p>"
        f"<pre id='log'>{lines}</pre><p>End of log.</p>"
    )
    return _html("Build log", body)


# jQuery as Debian ships it (libjs-jquery, which python3.11-doc brings)
JQUERY = Path("/usr/share/javascript/jquery/jquery.js")


async def _jquery(request: web.Request) -> web.FileResponse:
    return web.FileResponse(JQUERY, headers={"Content-Type": "text/javascript"})


async def _page(request: web.Request) -> web.FileResponse:
    path = PAGES / request.match_info["name"]
    if not path.is_file():
        raise web.HTTPNotFound()
    return web.FileResponse(path)


@pytest_asyncio.fixture(scope="module")
async def site():
    """The pages on a loopback port of their own."""
    app = web.Application()
    app.router.add_get("/target", _target)
    app.router.add_get("/lookup", _lookup)
    app.router.add_get("/slow", _slow)
    app.router.add_get("/api/facts", _facts)
    app.router.add_get("/api/more", _more)
    app.router.add_get("/longpre.html", _longpre)
    app.router.add_get("/static/jquery.js", _jquery)
    app.router.add_get(r"/{name:[a-z_]+\.html}", _page)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def config(site: str) -> EnvConfig:
    return EnvConfig(
        allowed_hosts=(site.split("//", 1)[1],),
        action_timeout_s=ACTION_TIMEOUT_S,
        observation_chars=BUDGET,
        max_steps=MAX_STEPS,
    )


@pytest_asyncio.fixture(scope="module")
async def pool(site):
    rollout = RolloutConfig(browsers=1, contexts_per_browser=4)
    async with browser_pool(site, config(site), rollout) as p:
        yield p


def task(start_url: str) -> dict:
    return {
        "id": "conformance-1", "question": "Do what the page offers.", "answer": "done",
        "aliases": [], "type": "qa", "hops": 1, "start_url": start_url, "evidence": [],
    }  # fmt: skip


# ----------------------------------------------------------------------------- helpers


def first_text(result) -> str:
    """The text the model reads for ``reset()``'s result: a StepResult (its ``text``) or,
    from code where reset returned an Observation, that observation rendered. (An
    Observation has a ``text`` too, the bare page text, so the kind is told by
    ``observation``, which only a StepResult has.)"""
    if hasattr(result, "observation"):
        return result.text
    return render(result, BUDGET)


def observation_of(result):
    return result.observation if hasattr(result, "observation") else result


MARK = re.compile(r'\[(\d+)\]\s+([\w-]+)\s+"([^"\n]*)"')


def marks(text: str) -> list[tuple[int, str, str]]:
    """The numbered elements an som observation shows: (number, role, label)."""
    return [(int(n), role, label) for n, role, label in MARK.findall(text)]


def _norm(s: str) -> str:
    return " ".join(s.split()).lower()


def find_mark(text: str, name: str, *, exact: bool = False) -> int | None:
    """The number of the element labelled ``name`` (an exact label first, else the first
    label containing it); None when there is none."""
    shown = marks(text)
    for n, _, label in shown:
        if _norm(label) == _norm(name):
            return n
    if not exact:
        for n, _, label in shown:
            if _norm(name) in _norm(label):
                return n
    return None


def mark(text: str, name: str, *, exact: bool = False) -> int:
    """The number of the element whose label contains ``name``; fails showing the view."""
    n = find_mark(text, name, exact=exact)
    if n is None:
        pytest.fail(f"no numbered element labelled {name!r} in the observation:\n{text}")
    return n


_HEADER = re.compile(r"(URL|Title|Error|Note): |\[screenshot: ")


def seen(text: str) -> str:
    """The page text of an observation as the model reads it (within the budget): the
    rendered text without its leading URL/Title/Error/Note lines."""
    lines = text.splitlines()
    while lines and _HEADER.match(lines[0]):
        lines.pop(0)
    if lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


def unmark(text: str) -> str:
    """som text with each numbered element written as its label only, as a person reads
    it: ``see [3] link "note 4" for`` becomes ``see note 4 for``."""
    return re.sub(r'\[\d+\]\s+[\w-]+\s+"([^"\n]*)"(\s+value="[^"\n]*")?', r"\1", text)


def lines_of(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


def on_one_line(text: str, sentence: str) -> bool:
    """Whether ``sentence`` stands on one line of ``text`` (runs of spaces aside)."""
    return any(sentence in line for line in lines_of(text))


def q(s: str) -> str:
    """A string literal for an action."""
    return json.dumps(s)


class Episode:
    """One episode on a leased context: acts, keeps the latest view, closes on exit."""

    def __init__(self, pool, site: str, mode: str, path: str):
        self.pool, self.site, self.mode, self.path = pool, site, mode, path

    async def __aenter__(self) -> Episode:
        self._lease = self.pool.context()
        lease = await self._lease.__aenter__()
        try:
            self.env = make_env(
                self.mode, self.site, config(self.site), SearchConfig(), lease=lease
            )
            first = await self.env.reset(task(self.site + self.path))
        except BaseException:
            await self._lease.__aexit__(None, None, None)
            raise
        self.text = first_text(first)  # the latest observation, as the model reads it
        self.obs = observation_of(first)
        self.view = self.text  # the latest observation that showed the page
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.env.close()
        finally:
            await self._lease.__aexit__(*exc)

    @property
    def body(self) -> str:
        """The page text of the latest observation as the model reads it."""
        return seen(self.text)

    @property
    def url(self) -> str:
        return self.obs.url or ""

    @property
    def page(self):
        return self.env.backend.page

    async def do(self, action: str):
        r = await self.env.step(action)
        assert not r.terminated, (action, r.text)
        self.text, self.obs = r.text, r.observation
        if r.observation.text:
            self.view = r.text
        return r

    async def press(self, label: str, selector: str | None = None, *, exact: bool = False):
        """Click what is labelled ``label``: som by its number in the latest view,
        playwright by ``selector`` (``text=<label>`` unless given)."""
        if self.mode == "som":
            return await self.do(f"click({mark(self.view, label, exact=exact)})")
        return await self.do(f"click({q(selector or 'text=' + label)})")

    async def enter(self, label: str, value: str, selector: str):
        """Type ``value`` into the field labelled ``label`` (playwright: ``selector``)."""
        if self.mode == "som":
            return await self.do(f"type({mark(self.view, label)}, {q(value)})")
        return await self.do(f"fill({q(selector)}, {q(value)})")

    async def scroll_down(self, dy: int = 700):
        if self.mode == "som":
            return await self.do('scroll("down")')
        return await self.do(f"scroll(0, {dy})")


def episode(pool, site: str, mode: str, path: str) -> Episode:
    return Episode(pool, site, mode, path)


def arrived(ep: Episode, site: str, via: str) -> None:
    """The latest observation is the target page, reached by the link ``via``."""
    assert ep.url == f"{site}/target?via={via}", ep.text
    assert f"You arrived via {via}." in ep.text, ep.text


# ----------------------------------------------------------------------------- 1-4: handlers


@pytest.mark.parametrize("mode", MODES)
async def test_div_button_with_a_property_handler(pool, site, mode):
    """A person sees a green "Start" button (a div whose handler is set as the
    ``onclick`` property, no attribute, no addEventListener), clicks it, and the page
    says "Started". som numbers the div; playwright clicks it by its text."""
    async with episode(pool, site, mode, "/onclick_prop.html") as ep:
        assert "Not begun." in ep.text and "Started" not in ep.text
        r = await ep.press("Start")
        assert "Started: question 1 of 10." in r.text, r.text


@pytest.mark.parametrize("mode", MODES)
async def test_span_links_with_listeners_navigate(pool, site, mode):
    """A person sees underlined chapter names (spans with ``cursor: pointer`` and a click
    listener that sets ``location.href``) and clicks "Chapter two" to open it."""
    async with episode(pool, site, mode, "/span_links.html") as ep:
        await ep.press("Chapter two")
        arrived(ep, site, "chapter-2")


@pytest.mark.parametrize("mode", MODES)
async def test_delegated_handlers_on_pointer_divs(pool, site, mode):
    """A person clicks the "Pricing" tab and a "Documentation" link: divs and spans with
    ``cursor: pointer`` whose clicks one listener on the document handles (a tiny
    jQuery-style ``$.on(document, 'click', '.tab', ...)``). The tab shows its panel; the
    link opens the documentation."""
    async with episode(pool, site, mode, "/delegated.html") as ep:
        r = await ep.press("Pricing")
        assert "Selected tab: Pricing (plans start at 9 euros a month)" in r.text, r.text
        await ep.press("Documentation")
        arrived(ep, site, "delegated-docs")


@pytest.mark.parametrize("mode", MODES)
async def test_delegated_handler_on_plain_rows(pool, site, mode):
    """A person clicks "Hamburg" in a list of destinations and reads its next train. The
    rows look like text (no pointer cursor, no listener of their own): one listener on the
    document acts for ``e.target.closest('.row')``. som numbers the rows from that
    listener's record; the heading and the paragraphs stay unnumbered."""
    async with episode(pool, site, mode, "/delegated_plain.html") as ep:
        if mode == "som":
            assert {label for _, _, label in marks(ep.view)} == {"Berlin", "Hamburg", "Munich"}
        r = await ep.press("Hamburg", exact=True)
        assert "Next train to Hamburg: 09:40 from platform 1." in r.text, r.text


@pytest.mark.skipif(not JQUERY.exists(), reason="libjs-jquery is not installed (make setup)")
@pytest.mark.parametrize("mode", MODES)
async def test_jquery_delegated_handlers(pool, site, mode):
    """A glossary built with jQuery: ``$(document).on('click', '.term', ...)`` shows a
    term's definition and ``$(document).on('click', 'span.leave', ...)`` goes back to the
    course. The terms are bold spans without a pointer cursor; the selectors live only in
    jQuery's records of its events. A person clicks "antonym", then "Back to the course"."""
    async with episode(pool, site, mode, "/delegated_jquery.html") as ep:
        if mode == "som":
            assert {label for _, _, label in marks(ep.view)} == {
                "synonym", "antonym", "Back to the course",
            }  # fmt: skip
        r = await ep.press("antonym", exact=True)
        assert "antonym: a word with the opposite meaning." in r.text, r.text
        await ep.press("Back to the course")
        arrived(ep, site, "jquery-delegated")


@pytest.mark.parametrize("mode", MODES)
async def test_custom_dropdown(pool, site, mode):
    """A person opens the "Choose a colour" dropdown (a div) and picks "Blue" from its
    list (``<li>`` items with ``cursor: pointer`` and a listener on the list); the page
    then says "Chosen: Blue"."""
    async with episode(pool, site, mode, "/dropdown.html") as ep:
        assert "Chosen: nothing yet" in ep.text
        r = await ep.press("Choose a colour")
        if mode == "som":
            mark(r.text, "Blue", exact=True)  # the open list's items are offered
        else:
            assert "Blue" in r.text, r.text
        r = await ep.press("Blue", exact=True)
        assert "Chosen: Blue" in r.text, r.text


# ----------------------------------------------------------------------------- 5-6: shadow DOM, iframes


@pytest.mark.parametrize("mode", MODES)
async def test_shadow_dom_input_and_button(pool, site, mode):
    """A person reads the widget inside an open shadow root ("No greeting yet."), types
    a name into its "Your name" box, presses its "Greet" button and reads the greeting."""
    async with episode(pool, site, mode, "/shadow.html") as ep:
        assert "No greeting yet." in ep.text, ep.text
        await ep.enter("Your name", "Ada", 'input[placeholder="Your name"]')
        r = await ep.press("Greet")
        assert "Hello, Ada!" in r.text, r.text


@pytest.mark.parametrize("mode", MODES)
async def test_form_inside_a_same_origin_iframe(pool, site, mode):
    """A person fills the "City" box of a lookup form shown in an iframe (same origin),
    presses "Look up", and reads the forecast that loads in the iframe (its server
    answers after 0.8 s). In playwright
    mode the agent names the input as it would any other (``input[name=city]``)."""
    async with episode(pool, site, mode, "/iframe_host.html") as ep:
        assert "Look up" in ep.text, ep.text
        await ep.enter("City", "Oslo", "input[name=city]")
        r = await ep.press("Look up")
        assert "Forecast for Oslo: sunny, 14 degrees." in r.text, r.text
        assert "Weather desk" in r.text  # still on the host page


# ----------------------------------------------------------------------------- 7-10: what cannot be used


@pytest.mark.parametrize("mode", MODES)
async def test_link_covered_by_a_consent_modal(pool, site, mode):
    """While the cookie modal covers the page, a person cannot click "Read more" beneath
    it: som offers no number for it, and a playwright click fails saying the element is
    covered (not only that it timed out). After "Accept", the link works."""
    async with episode(pool, site, mode, "/modal.html") as ep:
        if mode == "som":
            assert find_mark(ep.text, "Read more") is None, ep.text
            mark(ep.text, "Accept")
        else:
            r = await ep.do('click("text=Read more")')
            error = r.observation.error or ""
            assert error and COVERED.search(error), r.text
            assert ep.url.endswith("/modal.html"), r.text
        await ep.press("Accept")
        await ep.press("Read more")
        arrived(ep, site, "read-more")


@pytest.mark.parametrize("mode", MODES)
async def test_disabled_button_until_the_box_is_ticked(pool, site, mode):
    """ "Submit" is disabled until "I agree to the terms" is ticked: a person cannot
    press it before (som does not number it, or refuses the click; playwright says it
    is disabled), ticks the box, and then it submits."""
    async with episode(pool, site, mode, "/disabled.html") as ep:
        if mode == "som":
            n = find_mark(ep.text, "Submit")
            if n is not None:
                r = await ep.do(f"click({n})")
                assert r.observation.error, r.text
                assert "Thank you" not in r.text
        else:
            r = await ep.do('click("text=Submit")')
            error = r.observation.error or ""
            assert "disabled" in error.lower(), r.text
            assert "Thank you" not in r.text
        await ep.press("I agree")
        r = await ep.press("Submit")
        assert "Thank you, you are signed up." in r.text, r.text


_UNDER_HEADER_JS = """() => {
  const bottom = document.getElementById('top').getBoundingClientRect().bottom;
  const hidden = [], visible = [];
  for (const a of document.querySelectorAll('main a')) {
    const r = a.getBoundingClientRect();
    if (r.top >= 0 && r.bottom <= bottom) hidden.push(a.textContent);
    else if (r.top >= bottom + 4 && r.bottom <= innerHeight - 4) visible.push(a.textContent);
  }
  return {hidden, visible};
}"""


@pytest.mark.parametrize("mode", MODES)
async def test_sticky_header_over_the_first_rows(pool, site, mode):
    """A sticky top nav stays in view while the page scrolls. After scrolling, a person
    sees the header's links ("Home", "Docs", "Contact") and the content below it; the
    view's text starts with the rows the header now covers (the scroll moved them up by
    less than a view), and a person scrolls a little to click one. So every link written
    is usable: som numbers the covered links too (no link is written without a number),
    and clicking one opens it, as clicking one in view does."""
    async with episode(pool, site, mode, "/sticky.html") as ep:
        r = await ep.scroll_down()
        where = await ep.page.evaluate(_UNDER_HEADER_JS)
        assert where["hidden"] and where["visible"], where  # the page is laid out as meant
        for word in ("Home", "Docs", "Contact"):
            assert word in seen(r.text), r.text
        written = [w for w in where["hidden"] + where["visible"] if w in seen(unmark(r.text))]
        assert set(where["hidden"]) & set(written), r.text  # covered rows are in the text
        if mode == "som":
            for word in ("Home", "Docs", "Contact", *written):
                mark(r.text, word, exact=True)
        label = where["visible"][len(where["visible"]) // 2]
        await ep.press(label, f"text={q(label)}", exact=True)
        arrived(ep, site, "topic-" + label.split()[1])
        await ep.do("back()")
        r = await ep.scroll_down()
        where = await ep.page.evaluate(_UNDER_HEADER_JS)
        label = next(w for w in where["hidden"] if w in seen(unmark(ep.view)))
        await ep.press(label, f"text={q(label)}", exact=True)  # under the header: it works
        arrived(ep, site, "topic-" + label.split()[1])


@pytest.mark.parametrize("mode", MODES)
async def test_canvas_control_is_reported_not_labellable(pool, site, mode):
    """A "PLAY" button drawn on a <canvas> has no text or role a reader can name: the
    observation tells the agent a canvas is there that cannot be labelled (its text
    mentions "canvas" and "not labellable"), and som gives it no number."""
    async with episode(pool, site, mode, "/canvas.html") as ep:
        lower = ep.text.lower()
        assert "canvas" in lower and "not labellable" in lower, ep.text
        if mode == "som":
            mark(ep.text, "Help")  # the page's ordinary button is numbered
            numbered = [line for line in ep.text.splitlines() if re.search(r"\[\d+\]", line)]
            assert not [line for line in numbered if "canvas" in line.lower()], ep.text
            for e in ep.obs.elements:
                assert "canvas" not in json.dumps(e).lower(), e


# ----------------------------------------------------------------------------- 11-12: text as a person reads it


def _indent(text: str, start: str) -> int:
    for line in text.splitlines():
        if line.lstrip().startswith(start):
            return len(line) - len(line.lstrip(" "))
    pytest.fail(f"no line starting {start!r} in:\n{text}")


@pytest.mark.parametrize("mode", MODES)
async def test_source_line_breaks_tables_and_pre(pool, site, mode):
    """A person reads a paragraph whose HTML source wraps mid-sentence as one flowing
    sentence, a table's cells as separate cells, and a code block with its indentation.
    The agent reads the same after scrolling down a bit, and when the page is opened at
    an ``#anchor`` further down."""
    async with episode(pool, site, mode, "/linebreaks.html") as ep:
        r = await ep.scroll_down(dy=400)
        text = seen(r.text)
        sentence = "the maximum number of attached databases which is set to 10 by default"
        assert on_one_line(text, sentence), text
        assert re.search(r"Name\s*\|\s*Storage\s*\|\s*Size", text), text
        assert re.search(r"main\s*\|\s*disk\s*\|\s*4 MB", text), text
        assert re.search(r"temp\s*\|\s*memory\s*\|\s*0 MB", text), text
        base = _indent(text, "def attach_limit")
        assert _indent(text, "limit = conn.getlimit") - base == 4, text
        assert _indent(text, "if limit < 10") - base == 4, text
        assert _indent(text, 'raise ValueError("too low")') - base == 8, text
    async with episode(pool, site, mode, "/linebreaks.html#limits") as ep:
        text = ep.body
        assert 0 <= text.find("Run-time limits") < 200, text
        assert "SQLite notes" not in text[: text.find("Run-time limits")]
        sentence = "The page cache holds at most 2000 pages unless the application changes it"
        assert on_one_line(text, sentence), text


def _log_lines(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\bline (\d{4}):", text)]


@pytest.mark.parametrize("mode", MODES)
async def test_citations_verify_against_the_whole_page(pool, site, mode):
    """An agent that cites the build log for its last line is supported although it never
    scrolled that far: each step records the whole page's text (without numbers), while
    its observation is the 4,000-character window it read."""
    from rollout.verifiers.citations import citation_support

    quote = f"line {LOG_LINES - 1}: step {LOG_LINES - 1} compiled, 0 warnings"
    async with episode(pool, site, mode, "/longpre.html") as ep:
        r = await ep.scroll_down()
        assert quote not in r.text and "[1]" not in r.observation.page_text
        step = ep.env.record.steps[-1]
        assert quote in step.page_text and step.page_text.count("\n") >= LOG_LINES
        assert step.page_text.startswith("Build log")  # from the top, not from the view
        url = f"{site}/longpre.html"
        assert citation_support([url], ep.env.record, [quote]) == (1, 1, 0)
        assert citation_support([url], ep.env.record, ["line 2001: step 2001"]) == (1, 0, 0)


@pytest.mark.parametrize("mode", MODES)
async def test_scrolling_moves_through_a_long_pre(pool, site, mode):
    """A person scrolls through a 2,000-line build log (one <pre>, about 80,000
    characters) and reads every line down to "line 2000". Each scroll moves the agent's
    view on: the first log line it shows advances, every line is shown at some point,
    and the last one is reached within a bounded number of scrolls."""
    async with episode(pool, site, mode, "/longpre.html") as ep:
        read = set(_log_lines(ep.body))
        first = min(read)
        scrolls = 0
        while LOG_LINES not in read:
            assert scrolls < 80, f"line {LOG_LINES} not reached after {scrolls} scrolls"
            r = await ep.scroll_down()
            scrolls += 1
            shown = _log_lines(seen(r.text))
            assert shown, r.text
            assert shown[0] > first, (
                f"scroll {scrolls} did not move the view: it starts at line {shown[0]} "
                f"(before: line {first})\n{r.text[:600]}"
            )
            first = shown[0]
            read.update(shown)
        missing = sorted(set(range(1, LOG_LINES + 1)) - read)
        assert not missing, f"{len(missing)} lines never shown, e.g. {missing[:10]}"


@pytest.mark.parametrize("mode", MODES)
async def test_paragraph_straddling_the_top_keeps_its_inline_words(pool, site, mode):
    """A long paragraph full of inline ``<code>`` and ``<a>`` words ("the default is
    typically 128 megabytes (shared_buffers)") straddles the top of the view after a
    scroll: a person reads its visible lines whole, and so does the agent; no inline
    word is dropped from a sentence that is shown."""
    async with episode(pool, site, mode, "/straddle.html") as ep:
        r = await ep.scroll_down()
        box = await ep.page.evaluate(
            "() => { const r = document.getElementById('long').getBoundingClientRect();"
            " return [r.top, r.bottom]; }"
        )
        assert box[0] < 0 < box[1], box  # the paragraph straddles the top of the view
        shown = seen(r.text)
        text = " ".join(unmark(shown).split())  # as a person reads it
        sentence = re.compile(r"Setting param_(\d+) controls feature \1; see note \1 for details")
        assert sentence.search(text), shown
        assert not re.search(r"Setting\s+controls feature", text), shown  # <code> dropped
        assert not re.search(r"see\s+for details", text), shown  # <a> dropped
        assert not re.search(r"megabytes\s*\(\s*\)", text), shown
        if "128 megabytes" in text:
            whole = r"128 megabytes \(shared_buffers\), see the memory chapter\s*\."
            assert re.search(whole, text), shown


# ----------------------------------------------------------------------------- 13-15: navigation


def _starts_at(text: str, heading: str, limit: int = 200) -> None:
    at = text.find(heading)
    assert 0 <= at < limit, f"{heading!r} is not at the top of the view:\n{text[:800]}"


@pytest.mark.parametrize("mode", MODES)
async def test_table_of_contents_anchor_then_back_and_forward(pool, site, mode):
    """A person clicks "Section 7" in the table of contents and the page jumps to the
    Section 7 heading; "back" returns to the top of the same page (a move within the
    page, not an error), and "forward" jumps to Section 7 again."""
    async with episode(pool, site, mode, "/anchors.html") as ep:
        r = await ep.press("Section 7", 'text="Section 7"', exact=True)
        assert r.observation.url.endswith("/anchors.html#section-7"), r.text
        assert not r.observation.error, r.text
        _starts_at(seen(r.text), "Section 7 heading: Caching")
        r = await ep.do("back()")
        assert not r.observation.error, r.text
        assert not re.search(r"no (previous )?page", r.text, re.I), r.text
        assert r.observation.url.endswith("/anchors.html"), r.text
        assert "heading" in seen(r.text), r.text  # the observation shows the page
        r = await ep.do("forward()")
        assert not r.observation.error, r.text
        assert r.observation.url.endswith("/anchors.html#section-7"), r.text
        _starts_at(seen(r.text), "Section 7 heading: Caching")


@pytest.mark.parametrize("mode", MODES)
async def test_slow_page_and_far_fragment(pool, site, mode):
    """A person opens a report whose server sends the body 1.5 s after the head, and
    reads it whole once it has loaded; then opens a link to ``other.html#appendix`` and
    finds the view at the appendix, far down that page."""
    async with episode(pool, site, mode, "/nav.html") as ep:
        r = await ep.press("Open the slow report")
        assert not r.observation.error, r.text
        assert "Quarterly report" in r.text and "Report complete: 42 rows." in r.text, r.text
        await ep.do(f"goto({q(site + '/nav.html')})")
        r = await ep.press("Jump to the appendix")
        assert r.observation.url.endswith("/other.html#appendix"), r.text
        _starts_at(seen(r.text), "Appendix B: Glossary")


@pytest.mark.parametrize("mode", MODES)
async def test_hidden_first_match_does_not_stall(pool, site, mode):
    """A collapsed table of contents (``display: none``) holds an "Install" link before
    the visible "Install" link in the text. A person clicks the visible one; so does the
    agent, at once (well within the action timeout, not after waiting it out)."""
    async with episode(pool, site, mode, "/hidden_first.html") as ep:
        if mode == "som":
            assert [label for _, _, label in marks(ep.text)].count("Install") == 1, ep.text
        started = time.monotonic()
        await ep.press("Install", exact=True)
        took = time.monotonic() - started
        arrived(ep, site, "body-install")
        assert took < ACTION_TIMEOUT_S / 2, f"the click took {took:.1f} s"


# ----------------------------------------------------------------------------- 16: numbers


def _refs(text: str) -> list[tuple[int, int]]:
    """(mark number, reference number) of the article's reference links in a view."""
    out = []
    for n, _, label in marks(text):
        m = re.fullmatch(r"Reference (\d+) source", label)
        if m:
            out.append((n, int(m.group(1))))
    return out


async def test_som_numbers_mean_what_the_last_view_showed(pool, site):
    """After scrolling down a long article, a person clicks a link they see: in som,
    ``click(n)`` for a number shown in the current view opens THAT link, and a number
    the current view does not show is refused (an error, the page stays)."""
    async with episode(pool, site, "som", "/stale.html") as ep:
        assert _refs(ep.text), ep.text
        r = await ep.scroll_down()
        refs = _refs(r.text)
        assert refs, r.text
        n, ref = refs[len(refs) // 2]
        await ep.do(f"click({n})")
        arrived(ep, site, f"ref-{ref}")
    async with episode(pool, site, "som", "/stale.html") as ep:
        before = {n for n, _, _ in marks(ep.text)}
        r = await ep.scroll_down()
        now = {n for n, _, _ in marks(r.text)}
        assert now, r.text
        absent = sorted(before - now) or [max(now) + 1]
        r = await ep.do(f"click({absent[0]})")
        assert r.observation.error, r.text
        assert ep.url.endswith("/stale.html"), r.text


async def test_playwright_click_on_a_link_shown_after_scrolling(pool, site):
    """The same article in playwright mode: after scrolling, the agent clicks, by its
    text, a reference link its view shows, and that link opens."""
    async with episode(pool, site, "playwright", "/stale.html") as ep:
        r = await ep.scroll_down()
        shown = re.findall(r"Reference (\d+) source", seen(r.text))
        assert shown and shown[0] != "1", r.text[:600]  # the view moved down the article
        ref = shown[len(shown) // 2]
        selector = "text=" + q(f"Reference {ref} source")
        await ep.do(f"click({q(selector)})")
        arrived(ep, site, f"ref-{ref}")


# ----------------------------------------------------------------------------- 17-18: pages that change


@pytest.mark.parametrize("mode", MODES)
async def test_lazy_content_is_seen_after_scrolling(pool, site, mode):
    """A person scrolls down a page that fetches a fact (JSON) after load and appends
    a further section when its end comes into view (IntersectionObserver, then a
    fetch): they see the fact when they reach it, and the appended section appears
    as they reach the end. The agent's observation after the scroll that brings the
    end into view shows the appended section."""
    async with episode(pool, site, mode, "/lazy.html") as ep:
        r = await ep.scroll_down()
        assert "Fact: Otters hold hands while they sleep." in r.text, r.text
        for _ in range(5):
            r = await ep.scroll_down()
            reached = await ep.page.evaluate(
                "() => window.moreRequested === true || "
                "document.getElementById('sentinel').getBoundingClientRect().top < innerHeight"
            )
            if reached:
                assert "Chapter 2: The river delta" in r.text, r.text
                break
        else:
            pytest.fail(f"scrolling never reached the end of the page:\n{r.text}")


@pytest.mark.parametrize("mode", MODES)
async def test_observe_shows_a_change_after_load(pool, site, mode):
    """A page adds "Status: ready" 800 ms after it loads; a person who waits a second
    sees it. The agent's first view may not show it; observe() a second later does."""
    async with episode(pool, site, mode, "/changes.html") as ep:
        assert "Checking the build" in ep.text, ep.text
        await asyncio.sleep(1.0)
        r = await ep.do("observe()")
        assert not r.observation.error, r.text
        assert "Status: ready" in r.text, r.text
