"""`python -m learner.serve`: the embedded inference server, speaking SGLang's native HTTP API.

    python -m learner.serve (--init tiny | --hf DIR | --checkpoint DIR) [--port P] [--host H]

It serves the subset of SGLang's API the rollout side uses, with the same field
names and shapes, so the rollout client cannot tell it from SGLang:

- ``POST /generate``: ``input_ids`` (a list, or a list of lists for a batch) or
  ``text``; ``sampling_params`` (``temperature``, ``top_p``, ``top_k``,
  ``max_new_tokens``, ``stop_token_ids``, ``ignore_eos``, ``no_stop_trim``,
  ``skip_special_tokens``, ``sampling_seed``; ``seed`` is accepted as an alias);
  ``rid``, ``return_logprob``, ``logprob_start_len``, ``return_text_in_logprobs``.
  Reply: ``text``, ``output_ids`` (a matched stop token included), ``meta_info``
  with ``id``, ``finish_reason`` (``{"type": "stop", "matched": id}`` |
  ``{"type": "length", "length": n}`` | ``{"type": "abort", ...}``),
  ``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` (prompt tokens whose
  KV the prefix cache supplied), ``weight_version`` (and ``weight_versions``,
  ``{"version", "start", "end"}`` spans over the output, when a weight update
  reached the request mid-generation, as SGLang reports it),
  ``e2e_latency`` and, when asked, ``output_token_logprobs`` /
  ``input_token_logprobs`` as ``[logprob, token_id, text | null]`` items.
- ``GET /health``, ``GET /health_generate``, ``POST /flush_cache``,
  ``GET /get_model_info``, ``GET /get_weight_version``, ``GET /get_load``
  (this server's own: ``num_running_reqs``, ``num_waiting_reqs``, ``num_output_tokens``
  generated so far by the running batch, ``paused``), ``POST /abort_request``
  (``{"rid"}`` or ``{"abort_all": true}``), ``POST /pause_generation``
  (``{"mode": "abort" | "in_place" | "retract"}``), ``POST /continue_generation``,
  ``POST /update_weights_from_disk`` (``{"model_path", "weight_version",
  "flush_cache", "abort_all_requests"}`` -> ``{"success", "message"}``; an HF
  directory or an Orbax checkpoint).

KV caches are kept between requests (``inference.prefix_cache_tokens`` tokens,
LRU; ``--disable-radix-cache`` turns that off, as in SGLang): a prompt extending a
kept sequence, such as the next turn of an episode, runs only its new tokens.
``/flush_cache`` drops them, and like SGLang's it refuses (400) while requests are
running or queued; a weight update always drops them.

Logprobs are ``log_softmax(logits / temperature)`` of the sampled token, before
top-k/top-p, as SGLang reports them. When listening it prints one line,
``serving on http://HOST:PORT``, to stdout. It never imports the rollout side.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

from aiohttp import web
from flax import nnx

from learner.model.loading import Source, load_weights_into, open_source
from learner.serving.api import ApiError, build_response, parse_generate
from learner.serving.engine import Engine, Request, SamplingParams
from learner.serving.scheduler import Scheduler
from shared.config import RunConfig, add_config_args, config_from_args, setup_logging
from shared.lifeline import watch_parent
from shared.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("learner.serve")


class Server:
    """The HTTP handlers around one engine and its scheduler."""

    def __init__(
        self, source: Source, engine: Engine, scheduler: Scheduler, tokenizer: Tokenizer
    ) -> None:
        self.source = source
        self.engine = engine
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.weight_version = "default"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_route("*", "/flush_cache", self.flush_cache)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/get_weight_version", self.get_weight_version)
        app.router.add_get("/get_load", self.get_load)
        app.router.add_post("/abort_request", self.abort_request)
        app.router.add_post("/pause_generation", self.pause_generation)
        app.router.add_post("/continue_generation", self.continue_generation)
        app.router.add_post("/update_weights_from_disk", self.update_weights)
        return app

    async def _json(self, request: web.Request) -> dict:
        if not request.can_read_body:
            return {}
        try:
            body = await request.json()
        except ValueError:
            raise ApiError("the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError("the body must be a JSON object")
        return body

    @staticmethod
    def _error(message: str, status: int = 400) -> web.Response:
        return web.json_response({"error": {"message": message}}, status=status)

    # ------------------------------------------------------------------------- generate

    async def generate(self, request: web.Request) -> web.Response:
        t0 = time.monotonic()
        try:
            body = await self._json(request)
            reqs, batched, opts = parse_generate(body, self.tokenizer)
        except ApiError as e:
            return self._error(str(e))
        for r in reqs:
            problem = self.engine.check(r)
            if problem:
                return self._error(problem)
        try:
            await self.scheduler.submit(reqs)
        except Exception as e:  # a failed batch: this request's error, the server lives on
            log.exception("generation failed")
            return self._error(f"generation failed: {e}", status=500)
        latency = time.monotonic() - t0
        out = []
        for r, o in zip(reqs, opts, strict=True):
            item = build_response(r, o, self.tokenizer, self.weight_version, latency)
            item["meta_info"]["cached_tokens"] = r.cached_tokens
            out.append(item)
        return web.json_response(out if batched else out[0])

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        probe = Request(
            "health", [self.tokenizer.pad_id or 0], SamplingParams(temperature=0, max_new_tokens=1)
        )
        try:
            await asyncio.wait_for(self.scheduler.submit([probe]), timeout=60)
        except TimeoutError:
            return web.Response(status=503, text="generation timed out")
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        # SGLang flushes only when idle and answers 400 otherwise.
        if self.scheduler.running or self.scheduler.queue:
            return web.Response(
                status=400,
                text="Cache not flushed: there are running or queued requests.\n",
            )
        await self.scheduler.run_exclusive(self.engine.flush_cache)
        return web.Response(text="Cache flushed.\n")

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.source.path,
                "tokenizer_path": str(self.source.tokenizer_dir),
                "is_generation": True,
                "weight_version": self.weight_version,
                "preferred_sampling_params": None,
            }
        )

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def get_load(self, request: web.Request) -> web.Response:
        running = list(self.scheduler.running)
        return web.json_response(
            {
                "num_running_reqs": sum(r.finish_reason is None for r in running),
                "num_waiting_reqs": len(self.scheduler.queue),
                "num_output_tokens": sum(len(r.output_ids) for r in running),
                "paused": self.scheduler.paused,
            }
        )

    # ------------------------------------------------------------------------- control

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
        except ApiError as e:
            return self._error(str(e))
        rid = body.get("rid")
        if body.get("abort_all"):
            rid = None
        elif not isinstance(rid, str) or not rid:
            return self._error("give a rid, or abort_all: true")
        return web.json_response({"success": True, "aborted": self.scheduler.abort(rid)})

    async def pause_generation(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
        except ApiError as e:
            return self._error(str(e))
        mode = body.get("mode", "abort")
        if mode not in ("abort", "in_place", "retract"):
            return self._error(f"mode {mode!r}: expected abort, in_place or retract")
        aborted = self.scheduler.pause(mode)
        return web.json_response({"message": "Generation paused.", "aborted": aborted})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.scheduler.resume()
        return web.json_response({"message": "Generation continued."})

    async def update_weights(self, request: web.Request) -> web.Response:
        try:
            body = await self._json(request)
        except ApiError as e:
            return self._error(str(e))
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return web.json_response(
                {"success": False, "message": "model_path is required"}, status=400
            )
        if body.get("abort_all_requests"):
            self.scheduler.abort(None)
        try:
            if self.scheduler.held_in_place:  # the engine thread is parked mid-batch
                what = await asyncio.to_thread(self._load, path)
            else:
                what = await self.scheduler.run_exclusive(self._load, path)
        except Exception as e:  # the old weights stay in place
            log.warning("weight update from %s failed: %s", path, e)
            return web.json_response({"success": False, "message": str(e)}, status=400)
        for r in self.scheduler.running:  # held sequences go on under the new weights
            if r.finish_reason is None and r.output_ids:
                r.version_changes.append((self.weight_version, len(r.output_ids)))
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        log.info("loaded %s (weight_version %s)", what, self.weight_version)
        return web.json_response(
            {"success": True, "message": f"Loaded {what}.", "num_paused_requests": 0}
        )

    def _load(self, path: str) -> str:
        model = nnx.merge(self.engine.graphdef, self.engine.state)
        what = load_weights_into(model, path)
        self.engine.set_model(model)
        return what


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, RunConfig]:
    parser = argparse.ArgumentParser(
        prog="python -m learner.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--init", metavar="CONFIG", help="`tiny` or an HF config.json: random weights")
    src.add_argument("--hf", metavar="DIR", help="an HF checkpoint directory")
    src.add_argument("--checkpoint", metavar="DIR", help="an Orbax checkpoint (root or step dir)")
    parser.add_argument("--host", help="address to bind (default: inference.host)")
    parser.add_argument(
        "--port", type=int, help="port; 0 picks a free one (default: inference.port)"
    )
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory override")
    parser.add_argument("--max-batch", type=int, default=64, help="largest batch (default 64)")
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=5.0,
        help="how long a batch keeps collecting requests (default 5 ms)",
    )
    parser.add_argument(
        "--decode-chunk",
        type=int,
        default=8,
        help="decode steps per compiled chunk between checks (default 8)",
    )
    parser.add_argument("--max-len", type=int, help="context length (default: the model's)")
    parser.add_argument(
        "--disable-radix-cache",
        action="store_true",
        help="keep no KV between requests (default: inference.prefix_cache_tokens tokens)",
    )
    parser.add_argument("--weight-version", default="default", help="initial weight_version")
    add_config_args(parser)
    args = parser.parse_args(argv)
    return args, config_from_args(args)


async def serve(args: argparse.Namespace, config: RunConfig) -> None:
    source = open_source(
        init=args.init,
        hf_dir=args.hf,
        checkpoint=args.checkpoint,
        tokenizer_dir=args.tokenizer,
        param_dtype=config.learner.param_dtype,
        dtype=config.learner.compute_dtype,
        seed=config.learner.seed,
    )
    tokenizer = load_tokenizer(source.tokenizer_dir)
    eos = source.model.cfg.eos_token_ids or tokenizer.stop_ids
    engine = Engine(
        source.model,
        eos_ids=eos,
        max_batch=args.max_batch,
        max_len=args.max_len,
        decode_chunk=args.decode_chunk,
        seed=config.learner.seed,
        prefix_cache_tokens=0 if args.disable_radix_cache else config.inference.prefix_cache_tokens,
    )
    scheduler = Scheduler(engine, max_batch=args.max_batch, wait_ms=args.batch_wait_ms)
    server = Server(source, engine, scheduler, tokenizer)
    server.weight_version = args.weight_version
    scheduler.start()
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=2)
    await runner.setup()
    host = args.host or config.inference.host
    site = web.TCPSite(runner, host, config.inference.port if args.port is None else args.port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"serving on http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await scheduler.stop()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)
    setup_logging(config)
    watch_parent()  # started by learner.train: end with it
    try:
        asyncio.run(serve(args, config))
    except (FileNotFoundError, ValueError) as e:  # a bad --init/--hf/--checkpoint
        print(f"learner.serve: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
