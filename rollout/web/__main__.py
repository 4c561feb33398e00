"""`python -m rollout.web [--host 127.0.0.1] [--port 8900]`: serve the local web.

The first start builds the sites and the search index (about 20 s on 2 cores)
and caches the build in ``web.cache_dir``; later starts load it. When the
server is listening it prints one line, ``serving on http://HOST:PORT``, to
stdout (with ``--port 0`` that is where the chosen port is read).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from aiohttp import web

from rollout.web.build import load
from rollout.web.server import make_app
from shared.config import add_config_args, config_from_args
from shared.lifeline import watch_parent


async def serve(host: str, port: int, cache_dir: str | None) -> None:
    lw = load(cache_dir)
    runner = web.AppRunner(make_app(lw), access_log=None, shutdown_timeout=2)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"serving on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout.web", description=__doc__)
    add_config_args(parser)
    parser.add_argument("--host", help="address to bind (default: web.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: web.port, 8900; 0 = free)")
    parser.add_argument("--no-cache", action="store_true", help="build from scratch, cache nothing")
    args = parser.parse_args(argv)
    cfg = config_from_args(args).web
    watch_parent()  # started by learner.train: end with it
    host = args.host or cfg.host
    port = cfg.port if args.port is None else args.port
    asyncio.run(serve(host, port, None if args.no_cache else cfg.cache_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
