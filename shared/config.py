"""The run config: one TOML file describes a whole run, every process of it.

Each section is a frozen dataclass whose fields are declared with :func:`option`,
which records the field's documentation and its allowed values next to its
default. Loading validates everything: unknown sections or keys, wrong types and
out-of-range values fail with a :class:`ConfigError` naming the key and what is
allowed. Every entry point parses ``--config PATH`` and repeated
``--set section.key=value`` the same way, through :func:`add_config_args` and
:func:`config_from_args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

_DOC, _CHOICES, _RANGE = "doc", "choices", "range"


class ConfigError(ValueError):
    """A config that cannot be loaded; the message names the key and the allowed values."""


def option(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    le: float | None = None,
    gt: float | None = None,
) -> Any:
    """Declare a config field: its default, what it means, and its numeric bounds."""
    meta = {_DOC: doc, _RANGE: (ge, le, gt)}
    if isinstance(default, list | dict):
        raise TypeError("use tuples for sequence defaults: configs are immutable")
    return field(default=default, metadata=meta)


# ----------------------------------------------------------------------------- sections

# Names of registered environments and task sources (``rollout.registry``): the config
# checks their form; whether one is registered is checked where it is used, since
# plugins register theirs at run time.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
_DEFAULT_ENV = "api"


def _check_name(key: str, value: object, what: str) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ConfigError(
            f"{key} = {value!r}: expected {what} (a letter, then letters, digits, '_', '.' or '-')"
        )


@dataclass(frozen=True)
class WebConfig:
    """The local mini-web (``python -m rollout.web``), or an external site."""

    host: str = option("127.0.0.1", "Address the local web binds to; loopback by default.")
    port: int = option(8900, "Port of the local web; 0 picks a free port.", ge=0, le=65535)
    url: str | None = option(
        None, "Base URL of an already running web; unset starts the local web as a child."
    )
    cache_dir: str = option(
        ".cache/web", "Where the built site and its search index are cached between starts."
    )


@dataclass(frozen=True)
class SearchConfig:
    """The search backend the api mode calls."""

    backend: Literal["local", "searxng", "serper", "brave", "tavily"] = option(
        "local",
        "Search provider: `local`, an endpoint speaking the local web's JSON (the local web "
        "itself by default); `searxng`, a self-hosted SearXNG's JSON API; `serper` (Google "
        "results), `brave` (Brave Search API) or `tavily`, hosted APIs that need a key.",
    )
    url: str | None = option(
        None,
        "The backend's endpoint: for `local` an endpoint returning the local web's JSON (unset: "
        "the local web's); for `searxng` the instance's base URL (required); for the hosted "
        "APIs an override of their documented endpoint.",
    )
    api_key_env: str | None = option(
        None,
        "Environment variable holding the hosted API's key; unset: SERPER_API_KEY, "
        "BRAVE_API_KEY or TAVILY_API_KEY. The key itself never goes in a config file.",
    )
    top_k: int = option(10, "Results per search.", ge=1, le=100)
    timeout_s: float = option(5.0, "Timeout of one search request.", gt=0)
    retries: int = option(
        2, "Retries of a failed search request (connection errors, 429, 5xx), with backoff.",
        ge=0, le=10,
    )  # fmt: skip
    rate_limit_per_s: float = option(
        0.0, "Most search requests per second this process sends the backend; 0: no limit.", ge=0
    )


@dataclass(frozen=True)
class EnvConfig:
    """The browser environment wrapper."""

    mode: str = option(
        "api",
        "Action space: `api` (search API), `playwright` (full Playwright browser), `som` "
        "(Set-of-Mark), or any environment a plugin registers. The older name of env.kind: "
        "the two are one setting (set either; the default `api` yields to the other).",
    )
    kind: str | None = option(
        None,
        "The environment episodes run in, by its registered name (`api`, `playwright`, `som`, "
        "`tools` (tool calling, rollout/tools), or a plugin's: entry-point group "
        "deep_research_harness.envs); unset: env.mode. An "
        "unregistered name fails where it is used, listing the registered ones.",
    )
    max_steps: int = option(30, "Steps before an episode is truncated.", ge=1, le=1000)
    prompt: Literal["full", "compact"] = option(
        "full",
        "System prompt: `full` documents every action and argument; `compact` gives one "
        "line per action (a quarter of the tokens, for short-context policies).",
    )
    action_timeout_s: float = option(10.0, "Timeout of one action.", gt=0, le=600)
    observation_chars: int = option(
        4000, "Budget of page text shown per observation.", ge=100, le=1_000_000
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        "Hosts an agent may visit besides the web itself: host, host:port, a pattern "
        "(*.wikipedia.org) or `public` (any public host); the scheme must be http or https. "
        "Loopback, private, link-local and other non-public addresses (after DNS resolution) "
        "are refused unless their host is listed exactly.",
    )
    page_reader: Literal["markdown", "trafilatura"] = option(
        "markdown",
        "How api mode reads an HTML page: `markdown`, the page's main region as Markdown; "
        "`trafilatura`, main-content extraction (drops navigation, ads and boilerplate).",
    )
    max_page_bytes: int = option(
        5 << 20, "Largest page (HTML, PDF or text) api mode reads; larger ones are refused.",
        ge=1024,
    )  # fmt: skip
    user_agent: str = option(
        "DeepResearchHarness/0.1 (research agent)",
        "User-Agent of api-mode fetches, robots.txt matching and the browsers' contexts.",
    )
    robots_txt: Literal["auto", "on", "off"] = option(
        "auto",
        "Honour robots.txt: `auto`, on every host but the local web's own; `on`, everywhere; "
        "`off`, nowhere.",
    )
    host_concurrency: int = option(
        0, "Requests in flight to one host at once, across all episodes of a sidecar; 0: no cap.",
        ge=0,
    )  # fmt: skip
    host_interval_s: float = option(
        0.0,
        "Least time between the starts of two requests to one host, across all episodes of a "
        "sidecar; 0: none.",
        ge=0,
    )
    proxies: tuple[str, ...] = option(
        (),
        "Upstream proxies (http://host:port or socks5://host:port, credentials allowed): each "
        "episode's fetches and browser go out through one, sticky per episode, rotated across "
        "episodes; empty: direct.",
    )
    archive: Literal["off", "record", "replay"] = option(
        "off",
        "Archive the episodes' web in WARC files: `record`, every response an episode gets "
        "(search answers, api-mode pages, every browser request); `replay`, answer the same "
        "requests from the archive with nothing sent to the network.",
    )
    archive_dir: str | None = option(
        None,
        "Directory of the archive; unset: <run>/archive (the sidecar's run directory, or "
        "rollout.eval's --out).",
    )
    archive_fallback: Literal["none", "live"] = option(
        "none",
        "In replay, a request the archive does not hold: `none`, an error observation (not in "
        "the archive: URL); `live`, fetched from the network and recorded.",
    )
    archive_max_bytes: int = option(
        256 << 20, "Size at which an archive file is closed and the next one started.", ge=1 << 16
    )
    proxy_cooldown_s: float = option(
        60.0,
        "How long an upstream that failed to connect or answered with a ban (403, 429, a "
        "CAPTCHA page) is benched before it is used again.",
        gt=0,
    )
    screenshots: bool = option(False, "Attach a screenshot to som observations.")
    screenshot_format: Literal["png", "jpeg", "webp"] = option(
        "png",
        "How screenshots are encoded (som observations and the `screenshot` action). `png` "
        "is lossless and the smallest for pages of text; `jpeg` is smaller for photographs; "
        "`webp` is the smallest and the slowest to encode.",
    )
    screenshot_quality: int = option(
        80, "Quality of a `jpeg` or `webp` screenshot (1-100); png ignores it.", ge=1, le=100
    )
    screenshot_fast: bool = option(
        True,
        "Encode screenshots for speed (Chromium's optimizeForSpeed: a faster PNG "
        "compression, ~25% larger files) rather than for size.",
    )
    frame_clock: Literal["chromium", "environment"] = option(
        "environment",
        "Who draws the browser's frames: `environment`, the environment, with "
        "HeadlessExperimental.beginFrame: 60 frames a second while it acts, ever fewer "
        "between actions (down to one every 2 s), and one drawn at once for each "
        "screenshot; `chromium`, Chromium's own 60 Hz compositor clock (a screenshot "
        "waits a frame or two for it: about twice as slow).",
    )
    observation: Literal["text", "axtree"] = option(
        "text",
        "What browser observations show: `text`, the page's text as rendered with the "
        "numbered elements inline (som); `axtree`, the page's accessibility tree (ARIA "
        "snapshot), with the numbered elements listed after it in som mode.",
    )
    browser_path: str = option(
        "/usr/bin/chromium-headless-shell", "Chromium executable Playwright launches."
    )
    history: Literal["full", "keep_last", "window"] = option(
        "full",
        "Context policy of each turn's prompt: `full`, every earlier observation; "
        "`keep_last`, the last env.keep_last observations, earlier ones replaced by a one-line "
        "stub keeping the action and the URL; `window`, the last env.keep_last turns (action "
        "and observation), earlier turns left out, so every prompt is bounded whatever the "
        "episode's length (both need rollout.trajectory = 'per_turn').",
    )
    keep_last: int = option(
        3,
        "Observations env.history = 'keep_last' keeps verbatim; turns 'window' keeps (at least 1).",
        ge=0,
    )

    def __post_init__(self) -> None:
        # env.kind and env.mode are one setting: after loading both hold the environment's
        # name (code reads either), the default `api` yielding to a name set in the other.
        kind = self.mode if self.kind is None else self.kind
        for key, value in (("env.mode", self.mode), ("env.kind", kind)):
            _check_name(key, value, "the name of a registered environment")
        if self.mode not in (_DEFAULT_ENV, kind) and kind != _DEFAULT_ENV:
            raise ConfigError(
                f"env.kind = {kind!r} and env.mode = {self.mode!r} name different "
                "environments: set env.kind alone (env.mode is its older name)"
            )
        resolved = kind if kind != _DEFAULT_ENV else self.mode
        object.__setattr__(self, "kind", resolved)
        object.__setattr__(self, "mode", resolved)


@dataclass(frozen=True)
class RolloutConfig:
    """The rollout sidecar (``python -m rollout.serve``) and its engine."""

    host: str = option("127.0.0.1", "Address the sidecar binds to; loopback by default.")
    port: int = option(8901, "Port of the sidecar; 0 picks a free port.", ge=0, le=65535)
    urls: tuple[str, ...] = option(
        (), "Sidecars the learner pulls from; empty starts one locally as a child."
    )
    group_size: int = option(8, "Samples per task (G in GRPO).", ge=2, le=1024)
    max_concurrent_episodes: int = option(16, "Episodes running at once.", ge=1, le=4096)
    max_retries: int = option(
        2, "Reruns of an episode that ended in infra_error before its group is dropped.", ge=0
    )
    browsers: int = option(2, "Browser processes in the pool.", ge=1, le=256)
    contexts_per_browser: int = option(8, "Episodes one browser hosts at once.", ge=1, le=256)
    recycle_after: int = option(200, "Contexts a browser serves before it is replaced.", ge=1)
    buffer_dir: str = option("buffer", "Finished groups, persisted (relative to the run dir).")
    buffer_max_groups: int = option(
        64, "Finished groups kept before new episodes wait (backpressure).", ge=1
    )
    max_policy_lag: int = option(
        2, "Groups generated more than this many versions ago are dropped.", ge=0
    )
    policy: Literal["model", "oracle", "noisy_oracle"] = option(
        "model", "Who acts: the model through the inference servers, or a scripted policy."
    )
    trajectory: Literal["sequence", "per_turn"] = option(
        "sequence",
        "Training sequences of an episode: `sequence`, the whole episode as one; `per_turn`, "
        "one per turn (its prompt under env.history, then its generated tokens), all with "
        "the episode's advantage.",
    )
    oracle_noise: float = option(
        0.35,
        "Probability that each decision of the noisy_oracle policy is a mistake (in the "
        "tools kind: each lookup reads another indicator than the plan's).",
        ge=0,
        le=1,
    )
    oracle_premature: float = option(
        0.0,
        "Probability that a noisy_oracle episode stops one hop short: once the first "
        "evidence is in view and the last is not, it answers with the entity that evidence "
        "leads to (the bridge: 'Greece' for the capital of the country an airport is in), "
        "as an agent that does not check would (in the tools kind: the country an "
        "airport() step named). Drawn once per episode; 0 never.",
        ge=0,
        le=1,
    )
    oracle_give_up: float = option(
        0.0,
        "Probability that a noisy_oracle episode gives up at once: its first action answers "
        "'unknown', before it has opened a page, as an agent that does not try would. Drawn "
        "once per episode, from a stream of its own (its other draws stay the same); 0 "
        "never. The api, playwright and som kinds (the tools kind refuses it).",
        ge=0,
        le=1,
    )
    oracle_shortcut: bool = option(
        False,
        "The scripted oracles answer as soon as the evidence and the answer are in what they "
        "have read (a search snippet often has them), instead of walking the whole gold path.",
    )
    oracle_query: Literal["gold", "question"] = option(
        "gold",
        "What the scripted oracles search for: the gold path's keywords, or the question as "
        "asked (a copy of the prompt's text, which a small policy learns more easily).",
    )
    oracle_article: bool = option(
        False,
        "The scripted oracles answer with the article their evidence puts before the answer "
        "('the Asia/Kolkata' from '... is in the Asia/Kolkata time zone'): equal under the "
        "SQuAD normalisation, and copyable by a small policy from the word before it.",
    )
    oracle_heading: bool = option(
        False,
        "The scripted oracles answer a name the page in view has as its heading line as that "
        "line writes it ('# Vero Beach'): equal under the SQuAD normalisation (punctuation is "
        "dropped), and copyable by a small policy, which continues what followed the '#' it "
        "read (after '<answer> ' there is nothing in view to continue a bare name from).",
    )
    oracle_spaced_names: bool = option(
        False,
        "The tools oracle writes country names with the space they have in the question "
        '(lookup(" Jamaica", ...), answer(" Mauritius")): the tools ignore it, and the '
        "call's tokens are then the question's own (a BPE tokenizer splits ' Jamaica' and "
        "'Jamaica' differently), which a small policy copies.",
    )
    oracle_batched_lookups: bool = option(
        False,
        "The tools oracle reads the figures of one indicator for several countries in one "
        'lookup call naming them as the question lists them (lookup(" Peru, Chile and '
        'Bolivia", "population")): a span of the question to copy, instead of one call per '
        "country, each starting where its name does.",
    )
    seed: int = option(
        0, "Seed of the order the sidecar draws tasks in and of the noisy oracle's mistakes.", ge=0
    )
    task_source: str = option(
        "generated",
        "Where tasks come from, by registered name: `generated` (the task generator over the "
        "local web: rollout.split, task_types, task_templates), `file` (the JSONL file "
        "rollout.tasks_file), `tools` (the tool-calling domain's) or a plugin's (entry-point "
        "group deep_research_harness."
        "task_sources). An unregistered name fails where it is used, listing the registered ones.",
    )
    tasks_file: str | None = option(
        None, "The JSONL file of tasks of rollout.task_source = 'file' (--tasks FILE sets both)."
    )
    split: Literal["train", "dev", "test"] = option("train", "Task split episodes draw from.")
    task_types: tuple[str, ...] = option(
        ("qa", "browse_comp", "citation", "multi_doc"), "Task types episodes draw from."
    )
    task_templates: tuple[str, ...] = option(
        (),
        "Task templates episodes draw from (names as `python -m rollout.tasks --list` "
        "prints them, or the tool domain's: tools_per_capita, ...); empty: every template "
        "of task_types.",
    )
    auth_token: str | None = option(
        None, "Bearer token every sidecar request must carry; unset accepts any."
    )
    max_request_bytes: int = option(1 << 20, "Largest request body accepted.", ge=1024)

    def __post_init__(self) -> None:
        _check_name("rollout.task_source", self.task_source, "the name of a registered task source")
        if self.task_source == "file" and not self.tasks_file:
            raise ConfigError(
                "rollout.tasks_file is unset: expected the path of a JSONL file of tasks when "
                "rollout.task_source = 'file'"
            )


@dataclass(frozen=True)
class RewardConfig:
    """The process reward (``rollout.verifiers.process``), an auxiliary term beside the
    outcome: r = r_outcome + lambda * r_process, bounded so that no wrong episode
    (outcome below 1.0, the success threshold) outranks a right one in a GRPO group."""

    format_weight: float = option(
        0.1,
        "The format reward's tier (Search-R1's): a wrong but well-formed answer earns this, "
        "a malformed right one loses it; 0 makes the outcome the task's score alone (a "
        "wrong answer earns what no answer earns).",
        ge=0,
        le=0.9,
    )
    process: Literal["off", "evidence", "prm"] = option(
        "off",
        "Source of r_process in [0, 1]: `off` (the reward is the outcome alone); `evidence`, "
        "the fraction of the task's evidence pages the episode reached before answering; "
        "`prm`, the mean score a process reward model at reward.prm_url gives its steps.",
    )
    process_lambda: float = option(
        0.1, "lambda: the weight of r_process in the reward (0 logs it without training on it).",
        ge=0, le=1,
    )  # fmt: skip
    process_cap: float = option(
        0.5,
        "Share of a wrong episode's distance to success (1 - outcome) its process term may "
        "fill: every wrong total stays below 1.0, every right one at least 1.0. At most 0.9, "
        "so the gap stays a tenth of that distance (the learner's float32 resolves it).",
        ge=0, le=0.9,
    )  # fmt: skip
    prm_url: str | None = option(
        None,
        "The PRM's OpenAI-compatible endpoint: base URL, .../v1, or the full chat-completions "
        "URL; required by reward.process = 'prm'.",
    )
    prm_model: str = option("prm", "The `model` field of the PRM requests.")
    prm_api_key_env: str | None = option(
        None, "Environment variable holding the PRM's bearer token, if it needs one."
    )
    prm_timeout_s: float = option(30.0, "Timeout of one PRM request.", gt=0, le=600)
    prm_retries: int = option(
        2, "Retries of a PRM request (timeout, connection error, 429, 5xx, no score).",
        ge=0, le=10,
    )  # fmt: skip
    prm_max_steps: int = option(
        8, "Steps of an episode the PRM scores, evenly spread, the last included.", ge=1, le=100
    )
    prm_prompt: str = option(
        "", "The PRM's system message; empty: the built-in rubric, ending in `SCORE: x`."
    )

    def __post_init__(self) -> None:
        if self.process == "prm" and not self.prm_url:
            raise ConfigError(
                "reward.prm_url is unset: expected the PRM endpoint's URL when "
                "reward.process = 'prm'"
            )


@dataclass(frozen=True)
class InferenceConfig:
    """The inference engine: the embedded server, or a real SGLang or vLLM server."""

    backend: Literal["embedded", "sglang", "vllm"] = option(
        "embedded",
        "`embedded` serves the policy with `python -m learner.serve` (SGLang's HTTP API); "
        "`sglang` and `vllm` with the real engine, started by `learner.train` from an HF "
        "export of the policy when `urls` is empty (`make engines` builds their venvs).",
    )
    urls: tuple[str, ...] = option((), "Inference servers; empty starts one locally.")
    engine_python: str = option(
        "",
        "sglang/vllm started locally: the Python interpreter that has the engine installed; "
        "empty: `.venv-sglang/bin/python` or `.venv-vllm/bin/python` in the repository.",
    )
    engine_args: tuple[str, ...] = option(
        (),
        "sglang/vllm started locally: extra command-line flags for the engine's server, "
        'appended after the project\'s own (e.g. ["--tp-size", "8"]).',
    )
    engine_start_timeout_s: float = option(
        900.0, "sglang/vllm started locally: seconds to wait for the server's health check.", gt=0
    )
    dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto",
        "What the sglang/vllm server computes in and the HF export is written in; `auto`: "
        "the policy's parameter dtype (float32 for the tiny model).",
    )
    host: str = option("127.0.0.1", "Address the embedded server binds to.")
    port: int = option(8902, "Port of the embedded server; 0 picks a free port.", ge=0, le=65535)
    temperature: float = option(1.0, "Sampling temperature.", ge=0, le=10)
    top_p: float = option(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = option(-1, "Top-k sampling; -1 disables it.", ge=-1)
    max_new_tokens: int = option(64, "Tokens generated per action.", ge=1)
    max_context_tokens: int = option(1024, "Episode length in tokens; longer is truncated.", ge=16)
    observation_tokens: int = option(256, "Token budget of one observation.", ge=8)
    timeout_s: float = option(60.0, "Timeout of one generate request.", gt=0)
    retries: int = option(3, "Retries of a request on connection errors.", ge=0, le=20)
    prefix_cache_tokens: int = option(
        0,
        "Embedded server: KV kept between requests for prompts that extend a kept sequence "
        "(tokens, LRU-evicted; e.g. 65536); 0, the default, keeps none.",
        ge=0,
    )


@dataclass(frozen=True)
class LearnerConfig:
    """GRPO and the optimiser."""

    model: str = option("tiny", "`tiny` (built-in config) or a Hugging Face checkpoint directory.")
    steps: int = option(200, "Optimiser steps to run.", ge=0)
    groups_per_step: int = option(16, "GRPO groups per optimiser step.", ge=1)
    learning_rate: float = option(1e-4, "Peak learning rate.", gt=0, le=1)
    warmup_steps: int = option(10, "Linear warm-up steps.", ge=0)
    lr_schedule: Literal["cosine", "constant"] = option(
        "cosine",
        "After the warm-up: `cosine` decays to 0.1 x the peak at `steps`; `constant` holds it.",
    )
    weight_decay: float = option(0.0, "AdamW weight decay.", ge=0)
    adam_eps: float = option(
        1e-8, "AdamW epsilon: added to the root of the second moment.", gt=0, le=1
    )
    grad_clip: float = option(1.0, "Global gradient-norm clip; 0 disables it.", ge=0)
    clip_eps_low: float = option(0.2, "PPO ratio clip below 1.", ge=0, le=1)
    clip_eps_high: float = option(0.2, "PPO ratio clip above 1 (clip-higher).", ge=0, le=10)
    kl_coef: float = option(0.0, "k3 KL coefficient to a frozen reference; 0 keeps none.", ge=0)
    reference_forward: Literal["in_step", "separate", "on_arrival"] = option(
        "in_step",
        "With a KL term, where the reference's logprobs are computed: `in_step`, inside the "
        "step's program; `separate`, a program of its own run before each step, which is "
        "given them; `on_arrival`, that program run on each group's kept trajectories as "
        "the group comes from the sidecars, while the learner waits for the rest "
        "(learner.training.reference; bench/learner.py times all three).",
    )
    reference_chunk_rows: int = option(
        0,
        'With `reference_forward = "on_arrival"`: trajectories per run of the reference '
        "program (one per row); 0 takes rollout.group_size. Rounded up to a multiple of the "
        "rows the mesh and the micro-batches split a batch into.",
        ge=0,
    )
    temperature: float | None = option(
        None,
        "The temperature of the step's logprobs, log_softmax(logits / temperature), as the "
        "engines report the sampled tokens' logprobs: the ratio, the truncated importance "
        "weights and the KL then compare like with like. Unset: inference.temperature "
        "(1.0 when that is 0). SFT always trains at 1.",
        gt=0,
        le=10,
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "constant"] = option(
        "token_mean", "How token losses are aggregated."
    )
    scale_rewards: bool = option(True, "Divide advantages by the group std (off: Dr. GRPO).")
    adv_std: Literal["population", "sample"] = option(
        "sample",
        "The group std advantages are divided by: `sample` (ddof 1, as verl and TRL divide "
        "by) or `population` (ddof 0: advantages sqrt(G/(G-1)) as large, 1.07x at G = 8, "
        "1.41x at G = 2).",
    )
    tis_cap: float = option(
        2.0, "Cap of the truncated importance weight rollout vs learner; 0 disables.", ge=0
    )
    max_staleness: int = option(2, "Policy versions a token may lag behind.", ge=0)
    micro_batches: int = option(
        1,
        "Gradient accumulation: a step's rows are split into this many micro-batches "
        "whose gradients are summed before the one update (the same update; peak "
        "activation memory falls about this many times). Rows per step are rounded up "
        "to a multiple of micro_batches x the data x fsdp ways.",
        ge=1,
    )
    length_buckets: tuple[int, ...] = option(
        (256, 512, 1024), "Padded sequence lengths batches are packed into."
    )
    param_dtype: Literal["float32", "bfloat16"] = option("float32", "Parameter dtype.")
    compute_dtype: Literal["float32", "bfloat16"] = option("float32", "Compute dtype.")
    remat: Literal["none", "full", "dots_no_batch"] = option(
        "none",
        "Rematerialisation of each decoder block in the backward pass: `none` keeps every "
        "activation, `full` recomputes the block (only its input is saved), "
        "`dots_no_batch` saves the matmul outputs without batch dimensions (the weights' "
        "products) and recomputes the rest (MaxText's `minimal`).",
    )
    scan_layers: bool | Literal["auto"] = option(
        "auto",
        "Run the decoder blocks under one lax.scan over the stacked layer parameters "
        "(compile time flat in depth); false unrolls them (same numbers); `auto` unrolls "
        "a model of at most 8 blocks without remat (faster on XLA:CPU, compiles quickly) "
        "and scans the rest.",
    )
    attention: Literal["auto", "dense", "blockwise", "cudnn"] = option(
        "auto",
        "Attention kernel of the train step: `dense` holds the T x T scores, `blockwise` is "
        "a flash-style online softmax in JAX (no T x T memory, every backend), `cudnn` is "
        "jax.nn.dot_product_attention's cuDNN kernel (GPU, 16-bit inputs); `auto` takes "
        "cudnn on GPU for unpacked rows, else blockwise above 64 tokens and dense below.",
    )
    attention_block: int = option(
        0,
        "Query and key tile of the blockwise attention in tokens; 0 sizes it by the row "
        "length (a power of two near T / 6 within [32, 256], the fastest measured on CPU).",
        ge=0,
    )
    logprob_chunk: int = option(
        1024,
        "Token logprobs and entropy are computed this many positions at a time (the "
        "unembedding inside the chunk, recomputed in the backward pass), so no "
        "(B, T, vocab) array is held; 0 computes all positions at once.",
        ge=0,
    )
    packing: bool = option(
        False,
        "Pack several trajectories into each row (segment ids, positions restarting per "
        "trajectory, no attention across them); the GRPO loss is the unpacked one.",
    )
    packed_rows: int = option(
        0,
        "Rows of a packed step (learner.packing); 0 keeps one row per trajectory. Fewer rows "
        "than trajectories is where packing saves memory and time; a step whose trajectories "
        "do not fit is packed into one row per trajectory instead (a second compiled shape).",
        ge=0,
    )
    eval_every: int = option(50, "Steps between dev-split evaluations; 0 disables.", ge=0)
    eval_tasks: int = option(100, "Dev-split tasks per evaluation.", ge=1)
    test_tasks: int = option(
        0,
        "Test-split tasks evaluated before and after training, at the sampling temperature "
        "and greedily, into summary.json; 0 skips the test evaluation.",
        ge=0,
    )
    init_checkpoint: str | None = option(
        None,
        "A checkpoint directory whose latest committed parameters start a new run "
        "(an SFT warm start); unset starts from the model's initialisation.",
    )
    seed: int = option(0, "Seed of the learner's PRNG.", ge=0)


@dataclass(frozen=True)
class MeshConfig:
    """Devices and processes."""

    data: int = option(-1, "Data-parallel axis size; -1 takes the remaining devices.", ge=-1)
    fsdp: int = option(1, "Fully-sharded data-parallel axis size.", ge=-1)
    tensor: int = option(1, "Tensor-parallel axis size.", ge=-1)
    coordinator_address: str | None = option(
        None, "host:port of process 0 for jax.distributed; unset runs one process."
    )
    num_processes: int = option(1, "Learner processes in the run.", ge=1)
    process_id: int = option(0, "This process's index.", ge=0)
    device_memory_gib: float = option(
        80.0, "Memory of one accelerator; `learner.train --dry-run` fails above it.", gt=0
    )
    num_devices: int = option(0, "Devices the dry run plans for; 0 uses the devices present.", ge=0)
    cpu_devices: int = option(
        0,
        "On a host without accelerators: the devices `learner.train` and `learner.sft` split "
        "its CPU into (JAX's `jax_num_cpu_devices`), the batch sharded over them as over "
        "GPUs; 0 keeps JAX's one. XLA runs most of a small model's step on one thread, so "
        "one device per core is faster on a small host (docs/results/learner.md).",
        ge=0,
    )


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints and Hugging Face exports."""

    dir: str = option("checkpoints", "Checkpoint directory (relative to the run dir).")
    every_steps: int = option(50, "Steps between saves.", ge=1)
    max_to_keep: int = option(3, "Committed checkpoints kept.", ge=1)
    export_hf: Literal["auto", "always", "never"] = option(
        "auto",
        "Export HF safetensors at each weight push: `auto` does when the backend is sglang "
        "or vllm (their weight updates load it; written in `inference.dtype`).",
    )


@dataclass(frozen=True)
class SftConfig:
    """The supervised warm start of the embedded pipeline (``python -m learner.sft``)."""

    demos: int = option(
        0,
        "Noisy-oracle episodes collected through the sidecar before GRPO and fine-tuned on; "
        "0 skips the warm start.",
        ge=0,
    )
    min_reward: float = option(
        0.0,
        "Least reward of an exported demonstration; 0 keeps the oracle's mistakes too "
        "(an imperfect warm start leaves GRPO room to improve).",
    )
    context_weight: float = option(
        0.0,
        "Loss weight of the prompt and observation tokens relative to the assistant's "
        "(0: assistant tokens only). Language-modelling the pages read teaches a small "
        "policy to copy from them.",
        ge=0,
        le=1,
    )
    init_checkpoint: str | None = option(
        None,
        "Weights SFT starts from: an Orbax checkpoint (root or step directory) or an HF "
        "directory of the configured architecture; unset: a fresh initialisation.",
    )
    copy_steps: int = option(
        0,
        "Steps of the synthetic copy exercise alone before SFT (32 rows of 256 tokens each; "
        "see copy_rows). A policy trained from scratch learns to copy in a sudden drop of "
        "that loss (the tiny model: steps 450-525 at 2e-3); 0 for a pretrained model.",
        ge=0,
    )
    copy_rows: int = option(
        0,
        "Extra rows per SFT step of a synthetic copy exercise: random token spans, each "
        "repeated after a random gap, the loss on the repeats. It teaches a policy trained from "
        "scratch to copy from its context (induction), which the demonstrations alone are too "
        "few to teach; 0 for a pretrained model.",
        ge=0,
    )
    steps: int = option(300, "SFT optimiser steps.", ge=0)
    batch_size: int = option(32, "Sequences per SFT step.", ge=1)
    learning_rate: float = option(1.5e-3, "Peak SFT learning rate.", gt=0, le=1)
    warmup_steps: int = option(20, "Linear warm-up steps of SFT.", ge=0)
    seed: int = option(0, "Seed of the SFT data order.", ge=0)


@dataclass(frozen=True)
class LoggingConfig:
    """Where a run writes and how it shows progress."""

    run_dir: str = option("runs", "Parent of every run's directory.")
    run_name: str | None = option(None, "Name of this run's directory; unset uses a timestamp.")
    every_steps: int = option(1, "Steps between metric lines.", ge=1)
    progress: bool = option(True, "Show a progress bar on a terminal.")
    level: Literal["debug", "info", "warning", "error"] = option("info", "Log level.")
    trackers: tuple[Literal["jsonl", "tensorboard", "wandb", "mlflow"], ...] = option(
        ("jsonl", "tensorboard"),
        "Where the learner's metrics go: `jsonl` (`metrics.jsonl` in the run directory; the "
        "summary's plot reads it), `tensorboard` (`<run>/tensorboard`; off, with a warning, "
        "without tensorboardX), `wandb` (Weights & Biases) and `mlflow`. W&B and MLflow also get "
        "the run config as parameters and the summary table and `curves.png` as files; they "
        "need the `trackers` extra (`make setup-test` installs its locked versions).",
    )
    wandb_mode: Literal["offline", "online"] = option(
        "offline",
        "W&B mode: `offline` writes `<run>/wandb/offline-run-*` with no network or API key "
        "(upload later with `wandb sync`); `online` streams to the server (needs a login).",
    )
    wandb_project: str = option("deep-research-harness", "W&B project of the run.")
    wandb_entity: str | None = option(
        None, "W&B entity (user or team); unset: the logged-in account's default."
    )
    mlflow_tracking_uri: str | None = option(
        None,
        "MLflow tracking URI (`http://host:5000`, `sqlite:////abs/mlflow.db`); unset: "
        "$MLFLOW_TRACKING_URI, else a SQLite store in `<run>/mlflow` (no server).",
    )
    mlflow_experiment: str = option("deep-research-harness", "MLflow experiment of the run.")


@dataclass(frozen=True)
class RunConfig:
    """A whole run: every process reads its section of the same file."""

    web: WebConfig = field(default_factory=WebConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        if self.learner.temperature is None:  # the step's logprobs at the sampling temperature
            t = self.inference.temperature or 1.0
            learner = dataclasses.replace(self.learner, temperature=t)
            object.__setattr__(self, "learner", learner)


SECTIONS: dict[str, type] = typing.get_type_hints(RunConfig)


# ----------------------------------------------------------------------------- loading


def from_dict(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """Build a validated :class:`RunConfig` from a parsed TOML document."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of sections")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown section [{unknown[0]}]; allowed sections: {', '.join(SECTIONS)}"
        )
    sections = {}
    for name, cls in SECTIONS.items():
        values = data.get(name, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{name}] must be a table, got {type(values).__name__}")
        sections[name] = _build_section(name, cls, values, source)
    config = RunConfig(**sections)
    _check_cross_fields(config, source)
    return config


def _check_cross_fields(c: RunConfig, source: str) -> None:
    """Constraints between keys, named by the key a user would change."""
    if c.mesh.process_id >= c.mesh.num_processes:
        raise ConfigError(
            f"{source}: mesh.process_id = {c.mesh.process_id}: expected a value in "
            f"[0, {c.mesh.num_processes - 1}] (mesh.num_processes = {c.mesh.num_processes})"
        )
    buckets = c.learner.length_buckets
    if not buckets or any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise ConfigError(
            f"{source}: learner.length_buckets = {list(buckets)}: expected a non-empty, "
            "strictly increasing list of positive lengths"
        )
    if c.env.history != "full" and c.rollout.trajectory != "per_turn":
        raise ConfigError(
            f"{source}: env.history = {c.env.history!r}: expected 'full' when "
            "rollout.trajectory = 'sequence' (one sequence holds every observation)"
        )
    if c.env.history == "window" and c.env.keep_last < 1:
        raise ConfigError(
            f"{source}: env.keep_last = {c.env.keep_last}: expected at least 1 when "
            "env.history = 'window' (the turn in view)"
        )
    if c.rollout.trajectory == "per_turn" and c.learner.loss_agg == "seq_mean_token_mean":
        raise ConfigError(
            f"{source}: learner.loss_agg = 'seq_mean_token_mean': expected 'token_mean' or "
            "'constant' when rollout.trajectory = 'per_turn' (a turn is not an episode)"
        )
    if c.rollout.trajectory == "per_turn" and not c.learner.packing:
        raise ConfigError(
            f"{source}: learner.packing = false: expected true when rollout.trajectory = "
            "'per_turn' (an episode's turns outnumber the rows of one per episode)"
        )
    if c.inference.observation_tokens >= c.inference.max_context_tokens:
        raise ConfigError(
            f"{source}: inference.observation_tokens = {c.inference.observation_tokens}: "
            f"expected a value below inference.max_context_tokens = "
            f"{c.inference.max_context_tokens}"
        )


def _build_section(name: str, cls: type, values: dict[str, Any], source: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(
                f"{source}: unknown key {name}.{key}; allowed keys in [{name}]: {', '.join(fields)}"
            )
        kwargs[key] = _coerce(f"{name}.{key}", hints[key], fields[key], value, source)
    return cls(**kwargs)


def _coerce(key: str, hint: Any, f: dataclasses.Field, value: Any, source: str) -> Any:
    """Check ``value`` against the field's type and bounds; return it in the field's type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    optional = origin in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{source}: {key} = {value!r}: expected {expected}")

    # A union such as bool | Literal["auto"]: the first member the value fits.
    if origin in (typing.Union, types.UnionType):
        expected = []
        for member in args:
            try:
                return _coerce(key, member, f, value, source)
            except ConfigError as e:
                expected.append(str(e).rsplit(": expected ", 1)[-1])
        raise fail(" or ".join(expected))

    if origin is Literal:
        if not isinstance(value, str) or value not in args:
            raise fail(f"one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        item = args[0]
        if not isinstance(value, list | tuple):
            if typing.get_origin(item) is Literal:
                raise fail(f"a list, each one of {', '.join(map(repr, typing.get_args(item)))}")
            raise fail(f"a list of {item.__name__}")
        return tuple(_coerce(f"{key}[{i}]", item, f, v, source) for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise fail("an integer")
    elif hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise fail("a number")
        value = float(value)
        if not math.isfinite(value):
            raise fail("a finite number")
    elif hint is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    else:  # pragma: no cover - a field declared with a type this loader does not know
        raise TypeError(f"{key}: unsupported config type {hint!r}")
    ge, le, gt = f.metadata.get(_RANGE, (None, None, None))
    if (ge is not None and value < ge) or (le is not None and value > le):
        lo = "-inf" if ge is None else ge
        hi = "inf" if le is None else le
        raise fail(f"a value in [{lo}, {hi}]")
    if gt is not None and value <= gt:
        hi = f", {le}]" if le is not None else ", inf)"
        raise fail(f"a value in ({gt}{hi}")
    return value


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load a TOML file (or the defaults when ``path`` is None) and apply ``--set`` overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{source}: no such config file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{source}: not valid TOML: {e}") from None
    for item in overrides:
        section, key, value = parse_override(item)
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise ConfigError(f"--set {item}: [{section}] is not a table in {source}")
        data[section][key] = value
    return from_dict(data, source=source if not overrides else f"{source} + --set")


def parse_override(item: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value); the value is read as TOML, else a string."""
    name, sep, raw = item.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key or "." in key:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. env.mode=som")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: `--set env.mode=som`
    return section, key, value


# ----------------------------------------------------------------------------- writing


def to_dict(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Plain nested dicts; ``None`` values are left out (TOML has no null)."""
    out = {}
    for name in SECTIONS:
        section = getattr(config, name)
        out[name] = {
            f.name: list(v) if isinstance(v, tuple) else v
            for f in dataclasses.fields(section)
            if (v := getattr(section, f.name)) is not None
        }
    return out


def to_toml(config: RunConfig, *, with_docs: bool = False) -> str:
    """The config as TOML that :func:`load` reads back to an equal config."""
    lines = []
    for name, cls in SECTIONS.items():
        section = getattr(config, name)
        lines.append(f"[{name}]")
        for f in dataclasses.fields(cls):
            value = getattr(section, f.name)
            if with_docs:
                lines.append(f"# {f.metadata[_DOC]}")
            if value is None:
                if with_docs:
                    lines.append(f"# {f.name} =")
                continue
            lines.append(f"{f.name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, tuple | list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def describe() -> str:
    """Every section and key with its type, default and meaning (``--help-config``)."""
    return to_toml(RunConfig(), with_docs=True)


# ----------------------------------------------------------------------------- CLI


def add_config_args(
    parser: argparse.ArgumentParser, default: str | Path | None = None
) -> argparse.ArgumentParser:
    """The flags every entry point shares: ``--config``, ``--set`` and ``--print-config``.

    ``default`` is the config file read when ``--config`` is not given (built-in
    defaults when None).
    """
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None if default is None else str(default),
        help=f"run config (TOML); default: {default or 'built-in defaults'}",
    )
    parser.add_argument(
        "--set",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override one config value (repeatable), e.g. --set env.mode=som",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config as TOML, with documentation, and exit",
    )
    return parser


def setup_logging(config: RunConfig) -> None:
    """The entry points' logging: stderr at ``logging.level``; absl (Orbax's notes on
    read-only opens) only at ERROR; JAX's backend probe (``Unable to initialize backend
    'tpu'`` on every machine without one, an INFO line that reads like a failure) only
    at WARNING."""
    import logging
    import sys

    logging.basicConfig(
        level=config.logging.level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The config named by parsed ``add_config_args`` flags; exits with the message on error."""
    try:
        config = load(args.config, args.overrides)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    if getattr(args, "print_config", False):
        print(to_toml(config, with_docs=True))
        raise SystemExit(0)
    return config
