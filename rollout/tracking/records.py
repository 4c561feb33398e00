"""The episode record: every step an agent took and what it saw, as the environment fills it in.

The verifiers read it (which pages were visited and what text they held, which
tools were used), the tracker writes it to disk step by step, and the SFT export
reads it back. Every field is plain data, so a record round-trips through JSON
(:meth:`Step.to_json`, :meth:`Step.from_json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

STATUSES: tuple[str, ...] = ("ok", "truncated", "infra_error")
STEP_ERRORS: tuple[str, ...] = ("parse_error", "tool_error", "timeout")


def task_split(task_id: str) -> str:
    """The split a task belongs to: the part of its id before the first "-" (``train-qa-1``)."""
    return task_id.split("-", 1)[0]


@dataclass(frozen=True)
class Step:
    """One turn: what the model wrote, the action it became, and what came back."""

    index: int  # 1-based position in the episode
    raw: str  # the model's text for this turn, verbatim
    action: str | None  # action name ("search"); None when the text did not parse
    args: dict[str, Any] = field(default_factory=dict)  # the action's arguments as parsed
    observation: str = ""  # the text the model was shown next ("" after its answer)
    summary: str = ""  # one line for the progress log, e.g. "Got 10 results, top: bea.gov"
    error: str | None = None  # None, or one of STEP_ERRORS; the details are in `observation`
    url: str | None = None  # the page the browser or fetcher was on after the action
    page_text: str | None = None  # that page's text as extracted (may exceed the observation)
    started: float = 0.0  # unix time the model's text arrived and the action began
    ended: float = 0.0  # unix time the observation was ready
    note: str = ""  # the parser's remark, e.g. that further actions were ignored

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        """A step from its JSON form; unknown keys (a newer writer's) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def ran_tool(self) -> bool:
        """Whether this step used a tool: a parsed action other than the final answer."""
        return self.action is not None and self.action != "answer" and self.error != "parse_error"


@dataclass
class EpisodeRecord:
    """One episode from the first prompt to its end; ``status`` is None until it ends."""

    episode_id: str
    task: dict[str, Any]  # the task as loaded (id, question, answer, type, ...)
    mode: str  # "api", "playwright" or "som"
    system_prompt: str = ""  # the system message the model saw
    user_prompt: str = ""  # the first user message (the question as posed)
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None  # the final answer's text, None when there was none
    status: str | None = None  # one of STATUSES once ended
    error: str | None = None  # why the episode ended abnormally, if it did
    reward: float | None = None
    breakdown: dict[str, Any] = field(default_factory=dict)  # the reward's parts
    started: float = 0.0  # unix time
    ended: float | None = None

    @property
    def task_id(self) -> str:
        return str(self.task.get("id", ""))

    @property
    def finished(self) -> bool:
        return self.status is not None

    @property
    def parse_errors(self) -> int:
        return sum(1 for s in self.steps if s.error == "parse_error")

    @property
    def tool_steps(self) -> list[Step]:
        return [s for s in self.steps if s.ran_tool]
