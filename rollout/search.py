"""`python -m rollout.search --backend NAME [--url URL] [--key-env VAR] [-k N] "query"`.

Runs one search through the configured backend (``[search]`` of ``--config``, then
``--set``, then these flags) and prints the hits, numbered (title, URL, snippet), or
with ``--json`` one JSON object: ``{"backend", "query", "results": [{"url", "title",
"snippet"}]}`` or ``{"backend", "query", "error"}``. Exit status 0, or 1 on an error.
The ``local`` backend needs ``--url`` (an endpoint speaking the local web's JSON) or
``web.url`` (a running local web: ``python -m rollout.web``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from typing import Any

import aiohttp

from rollout.net.search_client import BACKENDS, SearchError, SearchHit, make_search_client
from shared.config import ConfigError, RunConfig, add_config_args, config_from_args


async def run(cfg: RunConfig, query: str) -> list[SearchHit]:
    """One search through the backend ``cfg.search`` describes."""
    async with aiohttp.ClientSession() as session:
        client = make_search_client(cfg.search, cfg.web.url or "", session)
        return await client.search(query)


def render(hits: list[SearchHit]) -> str:
    """The hits as api mode shows them to the agent: numbered title, URL, snippet."""
    if not hits:
        return "No results."
    return "\n".join(f"{i}. {h.title}\n   {h.url}\n   {h.snippet}" for i, h in enumerate(hits, 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout.search", description=__doc__)
    add_config_args(p)
    p.add_argument("--backend", choices=sorted(BACKENDS), help="search.backend")
    p.add_argument("--url", help="search.url: the endpoint (searxng: the base URL)")
    p.add_argument("--key-env", metavar="VAR", help="search.api_key_env: the key's variable")
    p.add_argument("-k", type=int, metavar="N", help="search.top_k: results to show")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("query")
    args = p.parse_args(argv)
    flags = {"backend": args.backend, "url": args.url, "api_key_env": args.key_env, "top_k": args.k}
    args.overrides += [f"search.{k}={json.dumps(v)}" for k, v in flags.items() if v is not None]
    cfg = config_from_args(args)
    out: dict[str, Any] = {"backend": cfg.search.backend, "query": args.query}
    try:
        if cfg.search.backend == "local" and not (cfg.search.url or cfg.web.url):
            raise ConfigError(
                "the local backend needs a running web: pass --url (its /api/search endpoint) "
                "or --set web.url=URL (start one with `python -m rollout.web`)"
            )
        hits = asyncio.run(run(cfg, args.query))
    except (SearchError, ConfigError) as e:
        if args.json:
            print(json.dumps({**out, "error": str(e)}))
        else:
            print(f"search error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**out, "results": [asdict(h) for h in hits]}))
    else:
        print(render(hits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
