"""Screenshots in real Chromium: the scroll's capture taken during its wait (kept only if
the page held still), scrolls that move nothing or glide, and the uncompressed channel."""

import asyncio
import time

import pytest
import pytest_asyncio
from aiohttp import web

from rollout.env import browser_pool, make_env
from rollout.env.frames import FRAME_TIMEOUT_S, IDLE_HZ, IDLE_MAX_S, FrameError
from shared.config import EnvConfig, RolloutConfig, SearchConfig
from tests.rollout.env.images import MARK_RGB, pixels

pytestmark = [pytest.mark.browser, pytest.mark.multiprocess]

ROWS = "".join(
    f'<p>Paragraph {i} of the page. <a href="/static#p{i}">link {i}</a></p>' for i in range(80)
)
PAGES = {
    "/static": f"<html><body>{ROWS}</body></html>",
    # a scroll handler that turns the page green on the next animation frame: a change
    # the text does not show, made while the environment waits after a scroll
    "/flash": f"""<html><body>{ROWS}<script>
addEventListener('scroll', () => requestAnimationFrame(() => {{
  document.body.style.background = 'rgb(0, 200, 0)'; }}));
</script></body></html>""",
    # a ticker that rewrites itself every animation frame: never still
    "/ticker": f"""<html><body><p id=t>0</p>{ROWS}<script>
let n = 0; const tick = () => {{ document.getElementById('t').textContent = String(++n);
  requestAnimationFrame(tick); }}; requestAnimationFrame(tick);
</script></body></html>""",
    # a page whose animation frames never come (its requestAnimationFrame replaced)
    "/norafs": f"<html><body>{ROWS}<script>window.requestAnimationFrame = () => 0;</script></body></html>",
    "/smooth": f"<html><head><style>html {{ scroll-behavior: smooth }}</style></head><body>{ROWS}</body></html>",
}
GREEN = (0, 200, 0)
# /colour on 127.0.0.1 and on 127.0.0.2 (another site: another renderer process)
COLOURS = {"127.0.0.1": (0, 0, 200), "127.0.0.2": (200, 0, 0)}


@pytest_asyncio.fixture(scope="module")
async def site():
    async def page(request):
        return web.Response(text=PAGES[request.path], content_type="text/html")

    async def colour(request):
        rgb = COLOURS[request.host.split(":")[0]]
        body = f"<html><body style='background: rgb{rgb}'>{ROWS}</body></html>"
        return web.Response(text=body, content_type="text/html")

    app = web.Application()
    for path in PAGES:
        app.router.add_get(path, page)
    app.router.add_get("/colour", colour)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    s = web.TCPSite(runner, "127.0.0.1", 0)
    await s.start()
    port = runner.addresses[0][1]
    await web.TCPSite(runner, "127.0.0.2", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def other_site(site: str) -> str:
    return site.replace("127.0.0.1", "127.0.0.2")


def config(site: str, **over) -> EnvConfig:
    hosts = (site.split("//")[1], other_site(site).split("//")[1])
    return EnvConfig(**{"allowed_hosts": hosts, "action_timeout_s": 5.0, **over})


@pytest_asyncio.fixture(scope="module", params=["chromium", "environment"])
async def pool(site, request):
    """Every test with Chromium's frame clock and with the environment's
    (rollout.env.frames): what the observations show must not depend on it."""
    async with browser_pool(
        site,
        config(site, frame_clock=request.param),
        RolloutConfig(browsers=1, contexts_per_browser=2),
    ) as p:
        yield p


class Env:
    """A som (or playwright) episode on ``path`` whose captures are counted."""

    def __init__(self, pool, site, path, mode="som", **cfg):
        self.pool, self.site, self.path, self.mode, self.cfg = pool, site, path, mode, cfg

    async def __aenter__(self):
        self.cm = self.pool.context()
        self.lease = await self.cm.__aenter__()
        cfg = config(self.site, **{"screenshots": True, **self.cfg})
        self.env = make_env(self.mode, self.site, cfg, SearchConfig(), lease=self.lease)
        be, real = self.env.backend, self.env.backend._capture
        self.captures = 0

        async def counted(*args, **kwargs):
            self.captures += 1
            return await real(*args, **kwargs)

        be._capture = counted
        task = {"id": "t", "question": "q", "answer": "a", "aliases": [], "type": "qa",
                "hops": 1, "evidence": [], "start_url": self.site + self.path}  # fmt: skip
        await self.env.reset(task)
        return self

    async def __aexit__(self, *exc):
        await self.env.close()
        await self.cm.__aexit__(*exc)


async def page_state(e: Env) -> dict:
    return await e.env.backend.page.evaluate(
        "() => ({y: scrollY, overlay: !!document.getElementById('__som_overlay'),"
        " watching: !!window[Symbol.for('som.watch')]})"
    )


async def test_a_scroll_s_shot_is_taken_during_its_wait_when_the_page_holds_still(pool, site):
    async with Env(pool, site, "/static") as e:
        first = e.captures
        r = await e.env.step('scroll("down")')
        o = r.observation
        assert e.captures - first == 1  # the early shot was kept: no second capture
        assert o.screenshot[:4] == b"\x89PNG" and o.elements
        assert e.env.backend.last_screenshot == o.screenshot
        # what the shot shows is what the text says: the marks of the elements now in view
        assert pixels(o.screenshot, MARK_RGB) > 100 * len(o.elements)
        assert "Paragraph 0 " not in o.text and o.elements[0]["id"] == 1
        assert await page_state(e) == {"y": 576, "overlay": False, "watching": False}


async def test_a_page_that_changes_during_the_wait_is_shot_again(pool, site):
    async with Env(pool, site, "/ticker") as e:
        first = e.captures
        await e.env.step('scroll("down")')
        # it changed after the marks were drawn: shot again (the environment's clock draws
        # the two frames before the page is read, so it takes one shot, after them)
        assert e.captures - first == (2 if pool.config.frame_clock == "chromium" else 1)
        assert await page_state(e) == {"y": 576, "overlay": False, "watching": False}
    # a change made while the environment waits after the scroll (the page turns green
    # on the frame after its scroll event) is in the shot, whichever capture it is
    async with Env(pool, site, "/flash") as e:
        assert pixels(e.env.first.screenshot, GREEN) == 0
        o = (await e.env.step('scroll("down")')).observation
        assert await e.env.backend.page.evaluate("document.body.style.background") != ""
        assert pixels(o.screenshot, GREEN) > 1280 * 720 // 4


async def test_a_scroll_that_moves_nothing_waits_for_nothing(pool, site):
    async with Env(pool, site, "/static", screenshots=False) as e:
        be = e.env.backend
        r = await e.env.step('scroll("up")')  # at the top already
        assert be.scrolled is False and r.observation.text == e.env.first.text
        r = await e.env.step('scroll("down")')
        assert be.scrolled is True and r.observation.text != e.env.first.text


async def test_a_page_asking_for_smooth_scrolling_is_scrolled_at_once(pool, site):
    async with Env(pool, site, "/smooth", screenshots=False) as e:
        o = (await e.env.step('scroll("down")')).observation
        assert (await page_state(e))["y"] == 576  # not somewhere along a glide
        assert "Paragraph 0 " not in o.text
    async with Env(pool, site, "/smooth", mode="playwright", screenshots=False) as e:
        await e.env.step("scroll(0, 300)")
        assert (await page_state(e))["y"] == 300


async def test_screenshots_go_over_an_uncompressed_channel_of_the_lease(pool, site):
    async with Env(pool, site, "/static", mode="playwright", screenshots=False) as e:
        o = (await e.env.step("screenshot()")).observation
        assert o.screenshot[:4] == b"\x89PNG" and o.error is None
        dt = await e.lease.devtools()
        assert dt._ws.compress == 0  # no permessage-deflate negotiated
        # closed under it: the next shot opens a new one
        await e.lease.close_devtools()
        assert (await e.env.step("screenshot()")).observation.screenshot[:4] == b"\x89PNG"
        assert (await e.lease.devtools()) is not dt
        # a channel that cannot be opened is the step's error, and the episode goes on
        await e.lease.close_devtools()
        port, e.lease.devtools_port = e.lease.devtools_port, 1
        r = await e.env.step("screenshot()")
        assert "screenshot failed" in (r.observation.error or "") and not e.env.done
        e.lease.devtools_port = port
        assert (await e.env.step("screenshot()")).observation.screenshot[:4] == b"\x89PNG"
    assert e.lease._devtools is None  # closed with the lease


async def test_a_channel_being_opened_as_the_lease_s_is_closed_does_not_outlive_it(pool, site):
    """The frame clock's tick may be opening the channel just as it is closed: closing
    waits for that opening and closes what it opened (before, the opening finished
    afterwards and left an open channel, on the old port, for the next screenshot)."""
    async with Env(pool, site, "/static", mode="playwright", screenshots=False) as e:
        await e.lease.close_devtools()
        opening = asyncio.create_task(e.lease.devtools())
        await asyncio.sleep(0)  # it holds the lease's lock, connecting
        await e.lease.close_devtools()
        dt = await opening
        assert dt.closed and e.lease._devtools is None
        assert (await e.lease.devtools()) is not dt  # the next use opens another


async def test_the_channel_follows_the_page_to_another_site_and_back(pool, site):
    """A navigation to another site moves the page to another renderer process; the
    screenshots' session on the page's target goes on showing what the page shows."""
    async with Env(pool, site, "/colour") as e:
        assert pixels(e.env.first.screenshot, COLOURS["127.0.0.1"]) > 1280 * 720 // 2
        for url, host in [(other_site(site), "127.0.0.2"), (site, "127.0.0.1")]:
            o = (await e.env.step(f'goto("{url}/colour")')).observation
            assert o.error is None and o.url.startswith(url)
            assert pixels(o.screenshot, COLOURS[host]) > 1280 * 720 // 2
            o = (await e.env.step('scroll("down")')).observation
            assert pixels(o.screenshot, COLOURS[host]) > 1280 * 720 // 2


async def test_the_environment_s_clock_draws_frames_only_as_needed(pool, site):
    """With frames issued by the environment: screenshots are frames drawn at once; pages
    of two episodes on one browser never have frames drawn at the same time (that crashes
    Chromium's GPU process); a page busy in a script does not hold the others' frames."""
    if pool.config.frame_clock != "environment":
        pytest.skip("the environment's frame clock")
    async with Env(pool, site, "/static") as a, Env(pool, site, "/flash") as b:
        assert a.lease.frames is not None and a.lease.frames._lock is b.lease.frames._lock
        pa, pb = a.env.backend.page, b.env.backend.page
        # both clocks at their acting rate, screenshots of both pages at once
        async with a.lease.frames.acting(), b.lease.frames.acting():
            steps = await asyncio.gather(a.env.step('scroll("down")'), b.env.step('scroll("down")'))
            steps += await asyncio.gather(a.env.step('scroll("up")'), b.env.step('scroll("up")'))
        assert all(s.observation.screenshot[:4] == b"\x89PNG" for s in steps)
        assert not (a.lease.browser_lost or b.lease.browser_lost)
        # frames between steps: the idle rate (a few a second), not sixty
        n = a.lease.frames.frames
        await asyncio.sleep(2.0)
        assert 1 <= a.lease.frames.frames - n <= 2 * 2 * IDLE_HZ
        # a page whose script runs for 5 s (a DOM change first: its next frame needs the
        # main thread): Chromium draws its frame only when the script ends, and while that
        # frame waits no other page may draw. Its frame is given up in FRAME_TIMEOUT_S;
        # the other page's frames, and a step with its screenshot, are drawn meanwhile
        began = await pb.evaluate(
            """setTimeout(() => { document.body.style.background = 'rgb(0, 0, 200)';
               const t = Date.now(); while (Date.now() - t < 5000) {} }, 0), Date.now()"""
        )
        busy = asyncio.ensure_future(b.lease.frames.frame(pb))
        for _ in range(5):
            await a.lease.frames.frame(pa)  # FrameError if not drawn in FRAME_TIMEOUT_S
        o = (await a.env.step('scroll("down")')).observation
        assert o.error is None and pixels(o.screenshot, MARK_RGB) > 0
        with pytest.raises(FrameError, match="busy in a script"):
            await busy
        assert time.time() * 1000 < began + 5000, "all of it while page b was busy"
        # once the script has ended, the busy page draws again
        await asyncio.sleep(max(0.0, (began + 5000) / 1000 - time.time()))
        await b.lease.frames.frame(pb)
        assert await pb.evaluate("1") == 1
        # a frame the browser has not answered (one asked for just as its page began a
        # long script) holds the others' frames: for FRAME_TIMEOUT_S at most, not for ever
        loop = asyncio.get_running_loop()
        async with a.lease.frames._lock:
            t = loop.time()
            with pytest.raises(FrameError, match="another page's frame"):
                await a.lease.frames.frame(pa)
            assert FRAME_TIMEOUT_S <= loop.time() - t < FRAME_TIMEOUT_S + 1.0
        await a.lease.frames.frame(pa)


async def test_a_frame_drawn_while_a_new_renderer_starts_still_gives_its_screenshot(pool, site):
    """The first frames after a navigation to another site (a new renderer process) come
    from Chromium without their image ("capturing a screenshot can fail during renderer
    initialization"): the clock draws frames until one has it, and it shows the new page."""
    if pool.config.frame_clock != "environment":
        pytest.skip("the environment's frame clock")
    async with pool.context() as lease:
        page = await lease.context.new_page()
        for i in range(10):
            host = ["127.0.0.2", "127.0.0.1"][i % 2]
            # outside an action: no frames drawn at the acting rate while it loads
            await page.goto(f"{site.replace('127.0.0.1', host)}/colour", wait_until="commit")
            assert (await lease.frames.frame(page, screenshot={"format": "png"}))[:4] == b"\x89PNG"
            await page.wait_for_load_state("load")
            shot = await lease.frames.frame(page, screenshot={"format": "png"})
            assert pixels(shot, COLOURS[host]) > 1280 * 720 // 2, (i, host)


async def test_between_actions_frames_are_drawn_ever_more_rarely(pool, site):
    """Idle frames, still page or animated: the wait doubles from 1/IDLE_HZ to
    IDLE_MAX_S; an action brings the idle rate back."""
    if pool.config.frame_clock != "environment":
        pytest.skip("the environment's frame clock")
    async with Env(pool, site, "/static") as still, Env(pool, site, "/ticker") as ticker:
        for _ in range(2):  # the second time after an action: the same again
            await asyncio.gather(*(e.env.step('scroll("down")') for e in (still, ticker)))
            before = [e.lease.frames.frames for e in (still, ticker)]
            await asyncio.sleep(4.0)
            drawn = [
                e.lease.frames.frames - b for e, b in zip((still, ticker), before, strict=True)
            ]
            # waits of 0.25, 0.5, 1 and 2 s: 4 or 5 frames in 4 s, not IDLE_HZ x 4 = 16
            assert IDLE_HZ == 4 and IDLE_MAX_S == 2
            assert all(3 <= n <= 6 for n in drawn), drawn


async def test_a_frame_without_its_image_still_gives_a_marked_shot_and_the_text(pool, site):
    """With the environment's clock the page takes its marks off once the frame with them
    is drawn. When that frame comes without its image (as the first frames of a new
    renderer do; made to happen here on the first frame), the marks are drawn again for
    the frame that has it: the shot shows them, the text is read without them, none are
    left on the page."""
    if pool.config.frame_clock != "environment":
        pytest.skip("the environment's frame clock")
    async with Env(pool, site, "/colour") as e:
        frames, real = e.lease.frames, e.lease.frames._draw
        dropped = []

        async def first_without_image(page, params, answered=False):
            r = await real(page, params, answered)
            if "screenshot" in params and not dropped:
                dropped.append(r.pop("screenshotData"))
            return r

        frames._draw = first_without_image
        o = (await e.env.step('scroll("down")')).observation
        frames._draw = real
        assert dropped and o.error is None
        assert pixels(o.screenshot, MARK_RGB) > 0 and pixels(o.screenshot, COLOURS["127.0.0.1"]) > 0
        assert "Paragraph 79" in o.page_text and "[" not in o.page_text
        assert not (await page_state(e))["overlay"]
        # and the ordinary way: one frame, its image marked, the marks gone after
        o = (await e.env.step('scroll("up")')).observation
        assert pixels(o.screenshot, MARK_RGB) > 0 and not (await page_state(e))["overlay"]


async def test_a_page_whose_animation_frames_never_come_still_gets_its_marked_shot(pool, site):
    """The marks come off in the page's task after the frame's animation frames, and a
    scroll waits two animation frames; where those never come (the page replaced
    requestAnimationFrame) the environment takes the marks off and reads the text
    itself, and the scroll's wait ends, within the action's time."""
    async with Env(pool, site, "/norafs") as e:
        steps = [(await e.env.step(a)).observation for a in ('scroll("up")', 'scroll("down")')]
        for o in (e.env.first, *steps):
            assert o.error is None, o.error
            assert pixels(o.screenshot, MARK_RGB) > 0
            assert "Paragraph 79" in o.page_text and not (await page_state(e))["overlay"]


async def test_a_frame_of_the_clock_s_own_begun_before_a_quiet_spell_is_drawn_before_it(pool, site):
    """The clock's own frame, begun before an observation's quiet spell and slow to reach
    the browser (a loaded machine), is drawn before the spell starts: drawn during it, it
    would run the animation frames the observation waits on (the marks taken off before
    the screenshot's frame). In the spell no frame is drawn but those asked for."""
    if pool.config.frame_clock != "environment":
        pytest.skip("the environment's frame clock")
    async with pool.context() as lease:
        page = await lease.context.new_page()
        await page.goto(site + "/static")
        frames, real = lease.frames, lease.frames._draw
        begun = asyncio.Event()

        async def slow(page, params, answered=False):
            begun.set()
            await asyncio.sleep(0.5)
            return await real(page, params, answered)

        frames._draw = slow
        async with frames.acting():  # the clock's own frames at once
            await begun.wait()
        frames._draw = real
        n = frames.frames
        async with frames.quiet():
            assert frames.frames == n + 1  # the frame begun before: drawn
            await page.evaluate(
                "window.__raf = 0; requestAnimationFrame(() => { window.__raf = 1; })"
            )
            await asyncio.sleep(1.0)  # more than the slow frame's wait: it is not drawn now
            assert await page.evaluate("window.__raf") == 0
            await frames.frame(page)  # the frame asked for runs it
            assert await page.evaluate("window.__raf") == 1


async def test_a_page_s_frames_asked_for_at_once_share_one_session(pool, site):
    """A page's first frames (its clock's tick and an episode's screenshot, say) asked
    for at the same moment attach one DevTools session to its target, not one each."""
    if pool.config.frame_clock != "environment":
        pytest.skip("the environment's frame clock")
    async with pool.context() as lease:
        page = await lease.context.new_page()
        await page.goto(site + "/static")
        dt, attached = await lease.devtools(), []
        real = dt.attach

        async def counted(target_id):
            attached.append(target_id)
            await asyncio.sleep(0.2)  # both frames ask while the first attach is under way
            return await real(target_id)

        async with lease.frames.quiet():  # the clock's own frames wait
            lease.frames._targets.clear()
            dt.attach = counted
            shots = await asyncio.gather(
                lease.frames.frame(page), lease.frames.frame(page, screenshot={"format": "png"})
            )
        assert shots[1][:4] == b"\x89PNG"
        assert len(attached) == 1
