"""Verifier settings: one frozen dataclass per concern, every field documented where declared."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from shared.config import RewardConfig

AnswerMetric = Literal["em", "f1"]
ProcessSource = Literal["off", "evidence", "prm"]
PROCESS_SOURCES: tuple[str, ...] = ("off", "evidence", "prm")
# An episode is right (a success) when its outcome reaches this, as rollout.eval, the
# engine's success counter and the learner's success rate count it.
SUCCESS = 1.0
# The largest process cap: a wrong episode's total stays at least (1 - CAP_MAX) of its
# distance to SUCCESS below it, a gap float32 advantages still resolve.
CAP_MAX = 0.9
DETECTORS: tuple[str, ...] = ("restated_question", "stitched_snippets", "overlong", "no_tool_use")


@dataclass(frozen=True)
class JudgeConfig:
    """An LLM judge behind any OpenAI-compatible ``POST /v1/chat/completions`` endpoint."""

    url: str  # base URL ("http://127.0.0.1:8000"), ".../v1", or the full completions URL
    model: str = "judge"  # the `model` field of the request
    api_key_env: str | None = None  # environment variable holding a bearer token, if any
    timeout_s: float = 30.0  # limit on one request, connection included
    retries: int = 2  # further attempts after a timeout, connection error, 429, 5xx or bad verdict
    backoff_s: float = 0.5  # wait before the first retry; doubles with each retry
    max_tokens: int = 512  # room for the judge's reasoning before its verdict line
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError("judge: timeout_s must be > 0, retries and backoff_s >= 0")


@dataclass(frozen=True)
class FormatConfig:
    """Format reward in tiers, as in Search-R1, with ``s`` the task score in [0, 1]:

    well-formed: ``max(s, weight)`` (a wrong but well-formed answer still earns
    ``weight``); malformed: ``max(0, s - weight)`` (a correct answer loses ``weight``,
    a wrong one earns nothing). An episode is well-formed when it ended with a
    non-empty answer and had at most ``max_parse_errors`` unparseable replies.
    ``weight = 0`` turns the format reward off.
    """

    weight: float = 0.1  # λ above; in [0, 1]
    max_parse_errors: int = 0  # unparseable replies tolerated in a well-formed episode

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 1 or self.max_parse_errors < 0:
            raise ValueError("format: weight must be in [0, 1] and max_parse_errors >= 0")


@dataclass(frozen=True)
class AntiCheatConfig:
    """Detectors of reward hacking; each is reported in the breakdown, and those named in
    ``zero_on`` set the reward to 0 when they fire."""

    zero_on: tuple[str, ...] = DETECTORS  # detectors that zero the reward (see DETECTORS)
    # restated_question: at least this many answer tokens, nearly all taken from the question
    restate_min_tokens: int = 3
    restate_max_novel: float = 0.1  # fraction of answer tokens absent from the question
    # stitched_snippets: the answer's word 4-grams mostly appear in search results seen
    stitch_min_tokens: int = 12
    stitch_overlap: float = 0.6  # fraction of 4-grams found in search observations
    max_answer_words: int = 300  # overlong: more words than this (citations excluded)
    # no_tool_use fires on tasks with hops >= 1 answered without any tool step

    def __post_init__(self) -> None:
        unknown = set(self.zero_on) - set(DETECTORS)
        if unknown:
            raise ValueError(f"anticheat.zero_on: unknown {sorted(unknown)}; known: {DETECTORS}")


@dataclass(frozen=True)
class CitationConfig:
    """Citation tasks: reward = correctness x citation score, where with n cited URLs,
    k supported (visited and holding an evidence quote) and u never visited, the
    citation score is ``max(0, (k - unvisited_penalty * u) / n)``: a fabricated
    citation costs more than an irrelevant visited one. No citation scores 0."""

    metric: AnswerMetric = "em"  # correctness of the answer's text
    unvisited_penalty: float = 1.0  # supported citations one unvisited citation cancels

    def __post_init__(self) -> None:
        if self.unvisited_penalty < 0:
            raise ValueError("citation.unvisited_penalty must be >= 0")


@dataclass(frozen=True)
class MultiDocConfig:
    """Multi-document tasks: coverage of the key facts (normalised containment), mixed with
    an LLM judge's verdict when a judge is configured and a verdict is available:
    ``(1 - judge_weight) * coverage + judge_weight * verdict``."""

    judge: JudgeConfig | None = None
    judge_weight: float = 0.5  # in [0, 1]
    on_judge_error: Literal["raise", "coverage"] = "raise"  # coverage: fall back, recorded

    def __post_init__(self) -> None:
        if not 0 <= self.judge_weight <= 1:
            raise ValueError("multi_doc.judge_weight must be in [0, 1]")


@dataclass(frozen=True)
class ProcessConfig:
    """The process reward, an auxiliary per-episode term (:mod:`rollout.verifiers.process`):
    ``r = r_outcome + term``, with ``r_process`` in [0, 1] from ``source`` and

    - right (``r_outcome >= SUCCESS``): ``term = weight * r_process``;
    - wrong: ``term = min(weight * r_process, cap * (SUCCESS - r_outcome))``;
    - an episode an anti-cheat detector zeroed: ``term = 0``.

    With ``cap < 1`` a wrong episode's total stays below ``SUCCESS`` (strictly), so
    no wrong episode outranks a right one in a GRPO group, whatever the weight;
    ``cap <= CAP_MAX`` keeps the gap at least a tenth of the distance.
    """

    source: ProcessSource = "off"  # "off", "evidence" (pages reached) or "prm" (a PRM endpoint)
    weight: float = 0.1  # λ above; in [0, 1]
    cap: float = 0.5  # share of a wrong episode's distance to SUCCESS the term may fill; [0, 0.9]
    prm: JudgeConfig | None = None  # the PRM endpoint, required by source "prm"
    prm_max_steps: int = 8  # steps scored per episode (evenly spread, the last included)
    prm_prompt: str = ""  # the PRM's system message; "" is process.PRM_RUBRIC

    def __post_init__(self) -> None:
        if self.source not in PROCESS_SOURCES:
            raise ValueError(f"process.source: {self.source!r}; expected one of {PROCESS_SOURCES}")
        if not 0 <= self.weight <= 1:
            raise ValueError("process.weight must be in [0, 1]")
        if not 0 <= self.cap <= CAP_MAX:
            raise ValueError(
                f"process.cap must be in [0, {CAP_MAX}]: at 1 a wrong episode's total could "
                "reach a right one's"
            )
        if self.source == "prm" and self.prm is None:
            raise ValueError("process.source 'prm' needs process.prm (the endpoint)")
        if self.prm_max_steps < 1:
            raise ValueError("process.prm_max_steps must be >= 1")

    @property
    def on(self) -> bool:
        return self.source != "off"


@dataclass(frozen=True)
class VerifierConfig:
    """Everything the verifiers read; the defaults suit the local web's tasks."""

    qa_metric: AnswerMetric = "em"  # which of EM / F1 is the qa reward (both are reported)
    citation: CitationConfig = field(default_factory=CitationConfig)
    multi_doc: MultiDocConfig = field(default_factory=MultiDocConfig)
    format: FormatConfig = field(default_factory=FormatConfig)
    anticheat: AntiCheatConfig = field(default_factory=AntiCheatConfig)
    process: ProcessConfig = field(default_factory=ProcessConfig)

    def __post_init__(self) -> None:
        if self.process.on and self.format.weight >= SUCCESS:
            raise ValueError(
                "format.weight = 1 makes every well-formed answer a success, so the process "
                "reward could rank a wrong answer above a right one; use a weight below 1"
            )


def verifier_config(reward: RewardConfig) -> VerifierConfig:
    """The verifier config of a run's ``[reward]`` section (:class:`shared.config.RewardConfig`:
    the format tier and the process reward); everything else keeps its default."""
    prm = None
    if reward.prm_url:
        prm = JudgeConfig(
            url=reward.prm_url, model=reward.prm_model, api_key_env=reward.prm_api_key_env,
            timeout_s=reward.prm_timeout_s, retries=reward.prm_retries,
        )  # fmt: skip
    process = ProcessConfig(
        source=reward.process, weight=reward.process_lambda, cap=reward.process_cap, prm=prm,
        prm_max_steps=reward.prm_max_steps, prm_prompt=reward.prm_prompt,
    )  # fmt: skip
    return VerifierConfig(format=FormatConfig(weight=reward.format_weight), process=process)
