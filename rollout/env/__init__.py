"""The environment: any registered kind (``env.kind``), in-tree the browser's three modes.

``make_env`` builds one episode's :class:`Environment` for the kind named, through
its entry in :data:`rollout.registry.envs`; ``browsers_for`` opens the browser pool
a kind needs (none for a kind without a browser), ``browser_pool`` and
``episode_lease`` the egress proxy, the pool and one episode's browser context. The
in-tree kinds registered here (:func:`register_kinds`, called by the registry on its
first lookup): ``api`` (search / visit / answer over HTTP), ``playwright`` (a browser
driven by selectors) and ``som`` (the page's interactive elements numbered); see ``core``.

It also holds the browser pool (:mod:`~rollout.env.pool`: Chromium processes, each
hosting a few browser contexts).

What it may import: the registry, what it is built from (:mod:`rollout.agent`: the
actions and their parser; :mod:`rollout.tracking`: the record and the tracker;
:mod:`rollout.net`: urls, egress, search client; :mod:`rollout.archive`), the
verifiers (:mod:`rollout.verifiers`) and :mod:`shared`. Never what builds on it
(:mod:`rollout.tools`, :mod:`rollout.sidecar` and the commands that run episodes), nor
:mod:`rollout.tasks` or :mod:`rollout.web` (``tests/test_import_boundaries.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from rollout.agent.actions import API_INTRO, BUILTIN_ACTIONS
from rollout.agent.policies import oracle_factory
from rollout.env.core import Environment, EpisodeLimits, InfraError, StepResult, ToolError
from rollout.env.observation import Observation, ScreenshotOptions, render
from rollout.env.pool import DEFAULT_ARGS, BrowserPool, Lease, PoolConfig
from rollout.net.core import Net, RobotsRefused, net_for, policy_for
from rollout.net.egress import EgressProxy, GateRefused
from rollout.net.resolver import AddressRefused
from rollout.net.search_client import make_search_client
from rollout.registry import BackendContext, EnvKind, envs
from shared.config import EnvConfig, RolloutConfig, SearchConfig

__all__ = [
    "Environment",
    "EpisodeLimits",
    "InfraError",
    "Observation",
    "StepResult",
    "ToolError",
    "browser_pool",
    "browsers_for",
    "episode_lease",
    "make_env",
    "net_for",
    "policy_for",
    "register_kinds",
    "render",
]


def make_env(
    mode: str,
    web_url: str,
    env: EnvConfig,
    search: SearchConfig | None = None,
    *,
    session: aiohttp.ClientSession | None = None,
    lease: Lease | None = None,
    run_dir: str | Path | None = None,
    episode_id: str | None = None,
    verifier=None,
    net: Net | None = None,
) -> Environment:
    """An environment for one episode of the kind ``mode`` names (``env.kind``; any
    registered one). api mode needs ``session`` (for search; ``search`` configures it,
    ``SearchConfig()`` when None); the browser modes need ``lease`` (a context from a
    :class:`BrowserPool`, :func:`episode_lease`) and no search config. ``net`` is what
    the process's episodes share to reach the web (:func:`net_for` by default)."""
    kind = envs.get(mode)
    if kind.browser and lease is None:
        raise ValueError(f"{mode} mode needs a browser lease (BrowserPool.context())")
    net = net if net is not None else net_for(web_url, env)
    policy = net.policy
    limits = EpisodeLimits(env.max_steps, env.action_timeout_s, env.observation_chars)
    ctx = BackendContext(
        kind.name, web_url, env, search if search is not None else SearchConfig(), policy, net,
        episode_id or "episode", session=session, lease=lease,
        run_dir=Path(run_dir) if run_dir is not None else None,
    )  # fmt: skip
    backend = kind.make_backend(ctx)
    return Environment(
        kind.name, backend, policy, limits=limits, verifier=verifier, run_dir=run_dir,
        episode_id=episode_id, prompt=env.prompt,
    )  # fmt: skip


def browsers_for(
    mode: str, web_url: str, env: EnvConfig, rollout: RolloutConfig, net: Net | None = None
):
    """The browser pool the kind needs (none for a kind without a browser, e.g. api mode),
    as an async context manager."""
    if not envs.get(mode).browser:
        return contextlib.nullcontext()
    return browser_pool(web_url, env, rollout, net)


# ----------------------------------------------------------------------------- the in-tree kinds


def _api_backend(ctx: BackendContext):
    if ctx.session is None:
        raise ValueError("api mode needs an aiohttp session for the search client")
    from rollout.env.api import ApiBackend

    env = ctx.env
    client = make_search_client(ctx.search, ctx.web_url, ctx.session)
    return ApiBackend(
        client, ctx.net, episode=ctx.episode_id, timeout_s=env.action_timeout_s,
        reader=env.page_reader, max_page_bytes=env.max_page_bytes,
    )  # fmt: skip


def _browser_options(env: EnvConfig) -> dict:
    return dict(
        action_timeout_s=env.action_timeout_s,
        observation_chars=env.observation_chars,
        observation=env.observation,
        screenshot=ScreenshotOptions(
            env.screenshot_format, env.screenshot_quality, env.screenshot_fast
        ),
    )


def _playwright_backend(ctx: BackendContext):
    from rollout.env.browser import PlaywrightBackend

    return PlaywrightBackend(ctx.lease, ctx.policy, **_browser_options(ctx.env))


def _som_backend(ctx: BackendContext):
    from rollout.env.browser import SomBackend

    env = ctx.env
    return SomBackend(ctx.lease, ctx.policy, screenshots=env.screenshots, **_browser_options(env))


_KINDS = (
    EnvKind(
        "api", BUILTIN_ACTIONS["api"], _api_backend, dialect="xml", oracle=oracle_factory("api"),
        intro=API_INTRO, doc="Search API: search, visit (the page's text over HTTP), answer.",
    ),
    EnvKind(
        "playwright", BUILTIN_ACTIONS["playwright"], _playwright_backend, dialect="call",
        browser=True, oracle=oracle_factory("playwright"),
        doc="A Playwright browser: goto, click and fill by selector, scroll, extract_text, ...",
    ),
    EnvKind(
        "som", BUILTIN_ACTIONS["som"], _som_backend, dialect="som", browser=True,
        oracle=oracle_factory("som"),
        doc="Set-of-Mark: the page's interactive elements numbered; click(n), type(n, text).",
    ),
)  # fmt: skip


def register_kinds() -> None:
    """Register the browser's three modes in :data:`rollout.registry.envs`. The registry
    calls this on its first lookup: it names it among its in-tree entries."""
    for kind in _KINDS:
        envs.register(kind.name, kind)


@contextlib.asynccontextmanager
async def browser_pool(
    web_url: str, env: EnvConfig, rollout: RolloutConfig, net: Net | None = None
):
    """The egress proxy (the allowlist, the address rule, politeness and the upstream proxies,
    enforced for every request) and a browser pool whose browsers reach the network only
    through it; both closed on exit. ``net``: :func:`net_for` by default."""
    net = net if net is not None else net_for(web_url, env)
    proxy = EgressProxy(
        net.policy, proxies=net.proxies, resolver=net.resolver, user_agent=net.user_agent,
        gate=_egress_gate(net),
    )  # fmt: skip
    await proxy.start()
    pool = BrowserPool(
        PoolConfig(
            browsers=rollout.browsers,
            contexts_per_browser=rollout.contexts_per_browser,
            recycle_after=rollout.recycle_after,
            executable=env.browser_path,
            args=(*DEFAULT_ARGS, *proxy.browser_args),
            frame_clock=env.frame_clock,
        )
    )
    pool.egress, pool.net = proxy, net  # episode_lease opens channels and archives on them
    try:
        await pool.start()
        yield pool
    finally:
        await pool.close()
        await proxy.close()


def _egress_gate(net: Net):
    """The egress proxy's gate: the address rule, robots.txt and the politeness slot; a
    refusal is shown to the agent as such."""

    @contextlib.asynccontextmanager
    async def gate(url: str):
        try:
            await net.check_host(url)  # an upstream proxy would resolve it unchecked
            await net.robots_check(url)
        except RobotsRefused as e:
            raise GateRefused(str(e)) from None
        except AddressRefused as e:
            raise GateRefused(e.reason) from None
        except OSError as e:  # the name does not resolve
            raise GateRefused(f"the host cannot be resolved: {e}") from None
        async with net.limiter.slot(url):
            yield

    return gate


@contextlib.asynccontextmanager
async def episode_lease(pool: BrowserPool | None, episode_id: str) -> AsyncIterator[Lease | None]:
    """A browser context for one episode (None without a pool: api mode). With upstream
    proxies the context goes out through its own egress channel, so the episode keeps
    one upstream; without, through the egress proxy's shared port as always. With
    ``env.archive`` on, its traffic is recorded (flushed before the context closes) or
    answered from the archive (:mod:`rollout.archive.browser`)."""
    if pool is None:
        yield None
        return
    egress: EgressProxy | None = pool.egress
    options = {}
    if egress is not None and egress.proxies is not None:
        options = await egress.open_channel(episode_id)
    try:
        async with pool.context(**options) as lease:
            await _attach_archive(lease, pool.net, episode_id)
            try:
                yield lease
            finally:
                if lease.recorder is not None and not lease.browser_lost:
                    await lease.recorder.flush()
    finally:
        if options:
            await egress.close_channel(episode_id)


async def _attach_archive(lease: Lease, net: Net | None, episode_id: str) -> None:
    if net is None or net.archive_mode == "off":
        return
    from rollout.archive.browser import BrowserRecorder, BrowserReplayer

    if net.recording:
        lease.recorder = await BrowserRecorder.attach(lease.context, net.writer, episode_id)
    if net.archive_mode == "replay":
        lease.replayer = await BrowserReplayer.attach(
            lease.context, net.archive, episode_id, fallback=lease.recorder
        )
