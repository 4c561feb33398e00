"""The Set-of-Mark labeller (``rollout/env/som_js.py``) in a real Chromium, page by page.

Each test sets a small page and runs ``LABEL_JS`` the way the backend does; the pages are
the third-party patterns that went wrong: handlers without markup, modals and sticky
headers over links, numbers left from an earlier pass, names, text as the browser lays it
out, shadow DOM, iframes, and the text window of a scrolled page.
"""

import html

import pytest
import pytest_asyncio
from aiohttp import web

from rollout.env.browser import run_labeller
from rollout.env.som_js import (
    LABEL_JS,
    LABELLER_INIT_JS,
    LISTENER_INIT_JS,
    OVERLAY_JS,
    REMOVE_OVERLAY_JS,
)
from tests.rollout.env.images import MARK_RGB, pixels

pytestmark = [pytest.mark.browser]

VIEW = {"width": 800, "height": 600}


@pytest_asyncio.fixture(scope="module")
async def ctx(browser):
    """One context for the module, with the listener script the backend installs."""
    c = await browser.new_context(viewport=VIEW)
    await c.add_init_script(script=LISTENER_INIT_JS)
    yield c
    await c.close()


@pytest_asyncio.fixture
async def page(ctx):
    p = await ctx.new_page()
    yield p
    await p.close()


@pytest_asyncio.fixture(scope="module")
async def other_origin():
    """A second origin on loopback, for a cross-origin iframe."""

    async def frame(request):
        return web.Response(text="<p>secret</p>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/frame", frame)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def label(page, **opts) -> dict:
    return await page.evaluate(
        LABEL_JS, {"marks": True, "fromViewport": False, "maxChars": 0, "maxLabels": 0, **opts}
    )


def names(view: dict) -> list[str]:
    return [e["name"] for e in view["elements"]]


async def som_id(page, selector: str) -> str | None:
    return await page.locator(selector).get_attribute("data-som-id")


def controls(n: int) -> str:
    items = "".join(
        f'<li><a href="/x/{i}">item {i}</a></li>' if i % 2 else f"<li><button>b{i}</button></li>"
        for i in range(n)
    )
    return f"<main><h1>Page</h1><ul>{items}</ul><p>text</p></main>"


# ----------------------------------------------------------------------------- numbering


async def test_numbers_restart_at_one_in_document_order_and_click_works(page):
    await page.set_content(
        '<p>Intro <a href="#a">first</a></p>'
        "<button onclick=\"window.hit = 'second'\">second</button>"
        '<input aria-label="third" value="v">'
    )
    for _ in range(2):
        view = await label(page)
        assert [(e["id"], e["role"], e["name"]) for e in view["elements"]] == [
            (1, "link", "first"),
            (2, "button", "second"),
            (3, "textbox", "third"),
        ]
    assert 'Intro [1] link "first"' in view["text"]
    await page.locator('[data-som-id="2"]').click()
    assert await page.evaluate("window.hit") == "second"


async def test_values_of_controls_are_shown(page):
    await page.set_content(
        '<input aria-label="q" value="hello">'
        '<input type="password" aria-label="pw" value="secret">'
        '<input type="checkbox" aria-label="cb" checked>'
        '<input type="radio" aria-label="rb">'
        '<select aria-label="s"><option>One</option><option selected>Two</option></select>'
        '<textarea aria-label="t">notes</textarea>'
    )
    text = (await label(page))["text"]
    for part in (
        '[1] textbox "q" value="hello"',
        '[2] textbox "pw" value="********"',
        '[3] checkbox "cb" value="checked"',
        '[4] radio "rb" value="unchecked"',
        '[5] combobox "s" value="Two"',
        '[6] textbox "t" value="notes"',
    ):
        assert part in text
    assert "secret" not in text


async def test_handlers_without_markup_get_numbers(page):
    """Defect 1: handlers set in script (property, addEventListener) and pointer cursors."""
    await page.set_content(
        '<span id="p">by property</span> <div id="l">by listener</div>'
        '<span id="m">by mousedown</span> <div id="gone">listener removed</div>'
        '<div style="cursor:pointer">pointer only <span>child</span></div>'
        '<div id="card" style="cursor:pointer"><a href="/x">inner link</a> card text</div>'
        '<div tabindex="0">focusable</div> <div role="tab">a tab</div>'
        "<script>"
        "p.onclick = () => {}; l.addEventListener('click', () => {});"
        "m.addEventListener('mousedown', () => {}, {passive: true});"
        "const f = () => {}; gone.addEventListener('click', f); gone.removeEventListener('click', f);"
        "card.addEventListener('click', () => {});"
        "</script>"
    )
    view = await label(page)
    assert names(view) == [
        "by property",
        "by listener",
        "by mousedown",
        "pointer only child",
        "inner link",
        "focusable",
        "a tab",
    ]
    assert "card text" in view["text"]  # the card holds a link: the link is numbered, not it


async def test_listener_script_stays_out_of_the_pages_way(page):
    await page.set_content('<button id="b">b</button>')
    out = await page.evaluate(
        """() => {
          let n = 0;
          b.addEventListener('click', () => n++, {once: true});
          b.click(); b.click();
          const opts = {capture: true};
          const g = () => n += 10;
          b.addEventListener('click', g, opts); b.click(); b.removeEventListener('click', g, true);
          b.click();
          return [n, EventTarget.prototype.addEventListener.toString(),
                  EventTarget.prototype.addEventListener.name,
                  Object.keys(window).some((k) => k.includes('som'))];
        }"""
    )
    assert out[0] == 11
    assert "[native code]" in out[1] and out[2] == "addEventListener"
    assert out[3] is False  # nothing of ours among the page's window properties


async def test_hidden_disabled_and_inert_are_not_numbered(page):
    """Defect 2: only what a person can use gets a number."""
    await page.set_content(
        '<div style="opacity:0"><a href="/1">faded</a></div>'
        '<div style="visibility:hidden"><a href="/2">invisible</a></div>'
        '<a href="/3" hidden>hidden attr</a>'
        '<div inert><a href="/4">inert</a></div>'
        '<input type="hidden" value="h">'
        '<a href="/5" style="display:inline-block;width:0;height:0;overflow:hidden">zero</a>'
        "<button disabled>disabled</button>"
        '<div role="button" aria-disabled="true">aria disabled</div>'
        '<fieldset disabled><input aria-label="in fieldset"></fieldset>'
        '<div style="height:0;overflow:hidden"><a href="/7">collapsed</a></div>'
        '<a href="/8" style="position:absolute;left:-9999px">off the page</a>'
        '<a href="/6">usable</a>'
    )
    assert names(await label(page)) == ["usable"]


async def test_modal_covers_the_page_until_it_is_gone(page):
    """Defect 2: a link behind a modal (in view and below the fold) has no number."""
    await page.set_content(
        '<a href="/bg">background</a><div style="height:3000px"></div><a href="/low">below fold</a>'
        '<div id="modal" style="position:fixed;inset:0;background:rgba(0,0,0,.5)">'
        '<div style="margin:100px auto;width:300px;background:#fff">'
        "<p>Accept cookies?</p><button>Close</button></div></div>"
    )
    assert names(await label(page)) == ["Close"]
    await page.evaluate("document.getElementById('modal').remove()")
    assert names(await label(page)) == ["background", "below fold"]


async def test_modal_dialog_covers_the_page(page):
    await page.set_content(
        '<a href="/bg">background</a><div style="height:3000px"></div><a href="/low">below fold</a>'
        "<dialog id=d><button>OK</button></dialog><script>d.showModal()</script>"
    )
    assert names(await label(page)) == ["OK"]


async def test_sticky_header_covers_content(page):
    await page.set_content(
        '<header style="position:sticky;top:0;height:100px;background:#fff;z-index:1">'
        '<a href="/home">Home</a></header>'
        '<div style="height:1000px"></div>'
        '<a id="t" href="/t" style="display:block;height:20px"'
        " onclick=\"window.hit = 't'; return false\">under the header</a>"
        '<a href="/v" style="display:block;height:20px;margin-top:300px">in view</a>'
        '<div style="height:2000px"></div>'
    )
    await page.evaluate("window.scrollTo(0, document.getElementById('t').offsetTop - 40)")
    view = await label(page)
    # written, so numbered: a scroll brings it out from under the header, and a click
    # (which scrolls it clear) reaches it
    assert names(view) == ["Home", "under the header", "in view"]
    assert '[2] link "under the header"' in view["text"]
    await page.locator('[data-som-id="2"]').click(timeout=5000)
    assert await page.evaluate("window.hit") == "t"


async def test_a_modal_still_covers_what_a_pinned_bar_covers(page):
    await page.set_content(
        '<header style="position:sticky;top:0;height:100px;background:#fff;z-index:1">'
        '<a href="/home">Home</a></header><div style="height:1000px"></div>'
        '<a id="t" href="/t" style="display:block;height:20px">under the header</a>'
        '<div style="height:2000px"></div>'
        "<dialog id=d><button>OK</button></dialog>"
    )
    await page.evaluate("window.scrollTo(0, document.getElementById('t').offsetTop - 40)")
    assert "under the header" in names(await label(page))
    await page.evaluate("d.showModal()")
    assert names(await label(page)) == ["OK"]


async def test_elements_below_the_fold_are_numbered(page):
    await page.set_content(
        '<div style="position:fixed;inset:0;z-index:-1;background:#eef"></div>'  # decoration
        '<a href="/a">top</a><div style="height:4000px"></div><a href="/b">deep</a>'
    )
    view = await label(page)
    assert names(view) == ["top", "deep"]
    assert view["elements"][1]["y"] > VIEW["height"]


async def test_a_button_is_one_number_whatever_is_inside(page):
    await page.set_content(
        '<button style="padding:20px"><span>Save</span> <b>now</b></button>'
        '<label style="display:inline-block;position:relative;padding-left:20px">'
        '<input type="checkbox" style="position:absolute;left:0;top:0;opacity:0;z-index:-1">'
        "Subscribe</label>"
    )
    view = await label(page)
    assert [(e["role"], e["name"]) for e in view["elements"]] == [
        ("button", "Save now"),
        ("checkbox", "Subscribe"),  # the hidden input's label stands in for it
    ]
    await page.locator('[data-som-id="1"]').click()  # a hit on the <span> is the button's
    await page.locator('[data-som-id="2"]').click()
    assert await page.evaluate("document.querySelector('input').checked")


# ----------------------------------------------------------------------------- stale numbers


async def test_numbers_of_an_earlier_pass_are_cleared(page):
    """Defect 3: an element the new pass does not number keeps no old number."""
    await page.set_content(
        '<div><a id="above" href="/a">above</a></div>'
        '<div id="box"><a id="boxed" href="/c">boxed</a></div>'
        '<div style="height:3000px"></div>'
        '<p id="low"><a id="below" href="/b">below</a></p><div style="height:2000px"></div>'
    )
    await label(page)
    assert [await som_id(page, s) for s in ("#above", "#boxed", "#below")] == ["1", "2", "3"]

    await page.evaluate("document.getElementById('box').style.display = 'none'")
    await label(page)
    assert await som_id(page, "#boxed") is None
    assert [await som_id(page, s) for s in ("#above", "#below")] == ["1", "2"]

    await page.evaluate("document.getElementById('low').scrollIntoView()")
    view = await label(page, fromViewport=True)
    assert names(view) == ["below"]
    assert await som_id(page, "#above") is None
    assert await som_id(page, "#below") == "1"
    assert await page.locator("[data-som-id]").count() == 1


async def test_text_mode_numbers_nothing_and_keeps_the_last_numbering(page):
    """A text-only pass (the whole page's text for the record, taken beside a marked view)
    leaves the numbers the agent was shown; the next marked pass replaces them."""
    await page.set_content('<a id="a" href="/a">a link</a> <a id="b" href="/b">another</a>')
    await label(page)
    view = await label(page, marks=False)
    assert view["elements"] == [] and view["text"] == "a link another"
    assert [await som_id(page, s) for s in ("#a", "#b")] == ["1", "2"]
    await page.evaluate("document.getElementById('a').remove()")
    await label(page)
    assert await som_id(page, "#b") == "1"


# ----------------------------------------------------------------------------- names


async def test_names_are_accessible_names_and_never_written_twice(page):
    """Defect 4: the name as the accessibility tree computes it, once."""
    long = "word " * 40
    await page.set_content(
        '<span id="lbl">Labelled by</span> <button aria-labelledby="lbl">x</button>'
        '<button aria-label="Close dialog">&times;</button>'
        '<label>Email <input type="email"></label>'
        '<input title="Titled">'
        '<input placeholder="Search docs">'
        '<input type="submit" value="Send">'
        '<input type="image" alt="Go" width="20" height="20">'
        '<a href="/i"><img alt="Logo" width="10" height="10"></a>'
        '<a href="/t" title="Only title"><span style="display:inline-block;width:10px;height:10px"></span></a>'
        '<label for="n">Full name</label> <input id="n">'
        f'<a href="/l">{long}</a>'
        "<label>Choose a file <button>Browse</button></label>"
    )
    view = await label(page)
    assert names(view) == [
        "Labelled by",
        "Close dialog",
        "Email",
        "Titled",
        "Search docs",
        "Send",
        "Go",
        "Logo",
        "Only title",
        "Full name",
        long.strip()[:80],
        "Browse",
    ]
    assert view["text"].count("Full name") == 1
    assert view["text"].count("Email") == 1
    assert 'Choose a file [12] button "Browse"' in view["text"]  # not the button's name: kept


async def test_a_clickable_with_long_text_keeps_its_text(page):
    para = "This card describes the result in detail. " * 5
    await page.set_content(
        f'<div id="card">{para}</div><pre tabindex="0">code line one\ncode line two</pre>'
        "<script>card.addEventListener('click', () => {})</script>"
    )
    view = await label(page)
    assert [(e["role"], e["name"]) for e in view["elements"]] == [("clickable", "")]
    assert '[1] clickable ""' in view["text"]
    assert para.strip() in view["text"]
    assert "code line one\ncode line two" in view["text"]  # a focusable <pre> is text


# ----------------------------------------------------------------------------- budget


async def test_max_chars_bounds_the_text_and_the_numbering(page):
    """Defect 5: past the text the agent reads, nothing is walked or numbered."""
    await page.set_content(controls(600))
    view = await label(page, maxChars=4000)
    assert len(view["text"]) <= 4000 and view["more"] is True
    assert 0 < len(view["elements"]) < 300
    assert [e["id"] for e in view["elements"]] == list(range(1, len(view["elements"]) + 1))
    assert await page.locator("[data-som-id]").count() == len(view["elements"])
    whole = await label(page)
    assert len(whole["elements"]) == 600 and whole["more"] is False


# ----------------------------------------------------------------------------- text


async def test_text_is_laid_out_like_the_browser(page):
    """Defect 6: whitespace by ``white-space``, blocks on their own lines."""
    await page.set_content(
        "<p>the maximum number of attached databases\nwhich is set to 10</p>"
        "<pre>def f():\n    return 1\n\n  x = 2</pre>"
        '<div style="white-space:pre-line">one   two\nthree</div>'
        "<div>block<br>after break</div><ul><li>first item</li><li>second item</li></ul>"
    )
    text = (await label(page, marks=False))["text"]
    assert "the maximum number of attached databases which is set to 10" in text
    assert "def f():\n    return 1\n\n  x = 2" in text
    assert "one two\nthree" in text
    assert "block\nafter break\nfirst item\nsecond item" in text


# how much wider a <q> is drawn than the text inside it: the glyphs the browser adds
_Q_EXTRA_JS = """() => [...document.querySelectorAll('q')].map(q => {
  const r = document.createRange();
  r.selectNodeContents(q);
  return Math.round(q.getBoundingClientRect().width - r.getBoundingClientRect().width);
})"""


async def test_quotation_elements_are_written_as_drawn(page):
    """A ``<q>`` is drawn with quotation marks (generated content: innerText leaves them
    out, the page shows them) and no space the source does not have: the observation
    writes what the page shows, nested quotes and a page's own ``quotes`` included."""
    await page.set_content(
        "<p>assign the user right<q>Lock pages in memory</q> to the account</p>"
        "<p>the right <q>Lock pages in memory</q>, then</p>"
        "<p>he said <q>she said <q>no</q> twice</q>.</p>"
        '<p lang=x style=\'quotes: "<<" ">>"\'>a <q>b</q> c</p>'
        "<p style='quotes: none'>plain <q>words</q> here</p>"
    )
    extra = await page.evaluate(_Q_EXTRA_JS)
    assert all(w > 0 for w in extra[:-1]) and extra[-1] == 0, extra  # drawn marks, or none
    inner = await page.evaluate("document.body.innerText")
    assert "user rightLock pages in memory to" in inner  # the marks left out
    text = (await label(page, marks=False))["text"]
    assert text.splitlines() == [
        "assign the user right\u201cLock pages in memory\u201d to the account",
        "the right \u201cLock pages in memory\u201d, then",
        "he said \u201cshe said \u2018no\u2019 twice\u201d.",
        "a <<b>> c",
        "plain words here",
    ]


async def test_tables_and_canvases(page):
    await page.set_content(
        "<table><tr><th>Name</th><th>Storage</th><th>Size</th></tr>"
        "<tr><td>alpha</td><td>disk</td><td>10</td></tr></table><canvas></canvas>"
    )
    view = await label(page)
    assert "Name | Storage | Size\nalpha | disk | 10" in view["text"]
    assert "[canvas 300x150: not labellable]" in view["text"]
    assert [(u["kind"], u["w"], u["h"]) for u in view["unlabellable"]] == [("canvas", 300, 150)]


async def test_shadow_dom_is_walked_and_clickable(page):
    await page.set_content(
        '<my-widget><a slot="extra" href="/light">light link</a></my-widget>'
        "<script>"
        "customElements.define('my-widget', class extends HTMLElement { constructor() { super();"
        " const r = this.attachShadow({mode: 'open'});"
        " r.innerHTML = '<p>Shadow text</p><button>Shadow button</button><slot name=extra></slot>';"
        " r.querySelector('button').onclick = () => { window.hit = 'shadow'; }; } });"
        "</script>"
    )
    view = await label(page)
    assert "Shadow text" in view["text"]
    assert names(view) == ["Shadow button", "light link"]
    await page.locator('[data-som-id="1"]').click()
    assert await page.evaluate("window.hit") == "shadow"


async def test_same_origin_iframe_is_labelled_and_clickable(page):
    inner = html.escape(
        '<p>Inside the frame</p><button onclick="window.hit = 1">Frame button</button>'
        "<span id=s>frame span</span><script>s.addEventListener('click', () => {})</script>"
    )
    await page.set_content(
        f'<a href="/out">outside</a><iframe srcdoc="{inner}" style="width:400px;height:200px"></iframe>'
    )
    view = await label(page)
    assert names(view) == ["outside", "Frame button", "frame span"]
    assert "Inside the frame" in view["text"]
    button = view["elements"][1]
    assert button["y"] > 0 and button["x"] > 0  # in the top document's viewport
    frame = page.frames[1]
    await frame.locator('[data-som-id="2"]').click()
    assert await frame.evaluate("window.hit") == 1


async def test_cross_origin_iframe_is_marked(page, other_origin):
    await page.set_content(
        f'<p>before</p><iframe src="{other_origin}/frame" style="width:300px;height:100px"></iframe>'
    )
    text = (await label(page))["text"]
    assert f"[iframe {other_origin}: not readable]" in text
    assert "secret" not in text


# ----------------------------------------------------------------------------- the window


async def test_a_paragraph_cut_by_the_view_keeps_its_inline_words(page):
    """Defect 7: the window starts at the start of the paragraph the top edge cuts."""
    words = " ".join(f"w{i}" for i in range(200))
    await page.set_content(
        '<p>An earlier paragraph.</p><div style="height:2000px"></div>'
        '<p id="p" style="width:300px;line-height:20px">The cache size <code>cache_size</code> '
        f'is set by the <a href="/pragma">pragma</a> and {words}</p><div style="height:3000px"></div>'
    )
    await page.evaluate("window.scrollTo(0, document.getElementById('p').offsetTop + 50)")
    view = await label(page, fromViewport=True)
    assert view["text"].startswith('The cache size cache_size is set by the [1] link "pragma"')
    assert "earlier" not in view["text"]


async def test_the_window_starts_at_the_view_when_the_body_is_one_viewport_high(page):
    paras = "".join(f"<p>Para {i} " + "lorem ipsum dolor sit amet " * 8 + "</p>" for i in range(60))
    await page.set_content(
        f"<style>html, body, #wrap {{ height: 100% }}</style><div id=wrap><div>{paras}</div></div>"
    )
    await page.evaluate("document.querySelectorAll('p')[30].scrollIntoView()")
    view = await label(page, fromViewport=True, maxChars=500)
    assert view["text"].startswith("Para 30 lorem")


async def test_a_long_pre_is_read_from_the_first_visible_line(page):
    """Defect 7: repeated scrolls move through a long <pre>, not back to its first line."""
    lines = "\n".join(f"line {i:04d} of the listing" for i in range(2000))
    await page.set_content(
        "<p>Heading text</p>"
        f'<pre id="pre" style="line-height:20px;font-size:14px;margin:0">{lines}</pre>'
    )
    first = []
    for target in (1000, 1030):
        await page.evaluate(
            f"window.scrollTo(0, document.getElementById('pre').offsetTop + {target} * 20)"
        )
        view = await label(page, fromViewport=True, marks=False, maxChars=2000)
        head = view["text"].split("\n")[0]
        assert head.startswith("line ") and head.endswith("of the listing"), head
        first.append(int(head.split()[1]))
        assert view["more"] is True
    assert 999 <= first[0] <= 1001
    assert 1029 <= first[1] <= 1031


async def test_without_from_viewport_the_whole_page_is_written(page):
    await page.set_content('<p>top words</p><div style="height:3000px"></div><p>low words</p>')
    await page.evaluate("window.scrollTo(0, 2000)")
    view = await label(page)
    assert view["text"] == "top words\nlow words"
    assert view["scrollY"] == 2000 and view["viewportHeight"] == VIEW["height"]


# ----------------------------------------------------------------------------- overlay


async def test_overlay_draws_and_goes(page):
    await page.set_content(controls(40))
    view = await label(page)
    await page.evaluate(OVERLAY_JS, view["elements"])
    assert await page.locator("#__som_overlay").count() == 1
    await page.screenshot()
    await page.evaluate(REMOVE_OVERLAY_JS)
    assert await page.locator("#__som_overlay").count() == 0
    await page.evaluate(OVERLAY_JS)  # with no list: the boxes of the last pass
    assert await page.locator("#__som_overlay").count() == 1
    await page.evaluate(REMOVE_OVERLAY_JS)


async def test_overlay_draws_its_marks_where_page_styles_cannot_reach_them(page):
    """The marks are an SVG in a closed shadow root: a page's rules for svg, rect and
    text do not move or hide them, and the labeller's walk does not read them. A page
    that broke attachShadow and OffscreenCanvas still gets its marks."""
    hostile = "<style>svg, rect, text, g { display: none !important; fill: lime; }</style>"
    broken = (
        "<script>Element.prototype.attachShadow = () => { throw new Error('no'); };"
        " window.OffscreenCanvas = undefined;</script>"
    )
    for extra in (hostile, broken):
        await page.set_content(extra + controls(40))
        view = await label(page)
        await page.evaluate(OVERLAY_JS, view["elements"])
        assert pixels(await page.screenshot(), MARK_RGB) > 500, extra
        assert (await label(page))["text"] == view["text"]
        await page.evaluate(REMOVE_OVERLAY_JS)


# ----------------------------------------------------------------------------- installed copy


async def test_installed_labeller_gives_what_the_whole_one_does(browser):
    """``run_labeller`` calls the copy ``LABELLER_INIT_JS`` put in the document before its
    scripts (whose own ``JSON.stringify`` the page cannot break), and sends the whole
    labeller where a document has none: both give the labeller's result."""
    page_html = controls(30) + "<script>JSON.stringify = () => 'broken';</script>"
    opts = {"marks": True, "fromViewport": False, "maxChars": 0, "maxLabels": 0}
    with_init = await browser.new_context(viewport=VIEW)
    await with_init.add_init_script(script=LISTENER_INIT_JS)
    await with_init.add_init_script(script=LABELLER_INIT_JS)
    bare = await browser.new_context(viewport=VIEW)
    try:
        views = []
        for c in (with_init, bare):
            p = await c.new_page()
            await p.set_content(controls(30))
            views.append(await run_labeller(p, opts))
            installed = await p.evaluate("() => Symbol.for('som.label') in window")
            assert installed is (c is with_init)
        assert views[0] == views[1] == await label(p)
        assert len(views[0]["elements"]) == 30
        p = await with_init.new_page()
        await p.set_content(page_html)
        assert (await run_labeller(p, opts))["elements"] == views[0]["elements"]
    finally:
        await with_init.close()
        await bare.close()
