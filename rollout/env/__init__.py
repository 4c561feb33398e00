"""The browser environment in three modes (api, playwright, som); see ``core``."""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from rollout.browser_pool import DEFAULT_ARGS, BrowserPool, Lease, PoolConfig
from rollout.egress import EgressProxy
from rollout.env.core import Environment, EpisodeLimits, InfraError, StepResult, ToolError
from rollout.env.observation import Observation, render
from rollout.search_client import SearchClient
from rollout.urls import UrlPolicy
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
    "make_env",
    "policy_for",
    "render",
]


def policy_for(web_url: str, env: EnvConfig) -> UrlPolicy:
    """The allowlist: the web's own host and port, plus the configured extra hosts."""
    netloc = urlsplit(web_url).netloc
    return UrlPolicy(allowed_hosts=(netloc, *env.allowed_hosts))


def search_endpoint(web_url: str, search: SearchConfig) -> str:
    return search.url or f"{web_url.rstrip('/')}/api/search"


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
) -> Environment:
    """An environment for one episode. api mode needs ``session`` (for search; ``search``
    configures it, ``SearchConfig()`` when None); the browser modes need ``lease`` (a
    context from a :class:`BrowserPool`) and no search config."""
    policy = policy_for(web_url, env)
    limits = EpisodeLimits(env.max_steps, env.action_timeout_s, env.observation_chars)
    if mode == "api":
        if session is None:
            raise ValueError("api mode needs an aiohttp session for the search client")
        from rollout.env.api import ApiBackend

        search = search if search is not None else SearchConfig()
        client = SearchClient(
            search_endpoint(web_url, search), session,
            top_k=search.top_k, timeout_s=search.timeout_s, retries=search.retries,
        )  # fmt: skip
        backend = ApiBackend(client, policy, timeout_s=env.action_timeout_s)
    elif mode in ("playwright", "som"):
        if lease is None:
            raise ValueError(f"{mode} mode needs a browser lease (BrowserPool.context())")
        from rollout.env.browser import PlaywrightBackend, SomBackend

        common = dict(
            action_timeout_s=env.action_timeout_s,
            observation_chars=env.observation_chars,
            observation=env.observation,
        )
        if mode == "som":
            backend = SomBackend(lease, policy, screenshots=env.screenshots, **common)
        else:
            backend = PlaywrightBackend(lease, policy, **common)
    else:
        raise ValueError(f"unknown mode {mode!r}; expected api, playwright or som")
    return Environment(
        mode, backend, policy, limits=limits, verifier=verifier, run_dir=run_dir,
        episode_id=episode_id, prompt=env.prompt,
    )  # fmt: skip


def browsers_for(mode: str, web_url: str, env: EnvConfig, rollout: RolloutConfig):
    """The browser pool the mode needs (none for api mode), as an async context manager."""
    if mode == "api":
        return contextlib.nullcontext()
    return browser_pool(web_url, env, rollout)


@contextlib.asynccontextmanager
async def browser_pool(web_url: str, env: EnvConfig, rollout: RolloutConfig):
    """The egress proxy (the allowlist, enforced for every request) and a browser pool
    whose browsers reach the network only through it; both closed on exit."""
    proxy = EgressProxy(policy_for(web_url, env))
    await proxy.start()
    pool = BrowserPool(
        PoolConfig(
            browsers=rollout.browsers,
            contexts_per_browser=rollout.contexts_per_browser,
            recycle_after=rollout.recycle_after,
            executable=env.browser_path,
            args=(*DEFAULT_ARGS, *proxy.browser_args),
        )
    )
    try:
        await pool.start()
        yield pool
    finally:
        await pool.close()
        await proxy.close()
