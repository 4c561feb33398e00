"""The tool domain's scripted oracle: follows a task's gold path, answers from what it read.

Like :class:`rollout.agent.policies.OraclePolicy` it writes model text in the mode's
dialect (calls) and knows only the plan, not the answer: it fills the
``calculate`` expression with the values its lookups returned (the task's
``formula``, which rounds as the question asks), then answers with the calculator's
result as it was shown, or with the country whose looked-up value is highest (lowest). When a
value it needs is missing from its observations it answers ``unknown``. Its
success therefore shows that the tools return the figures the tasks were built
from and that the dialect round-trips through the parser.

With ``spaced_names`` it writes each country name with the space that precedes it in
the question (``lookup(" Jamaica", "population")``, ``answer(" Mauritius")``). The
tools and the verifier ignore the space; what it changes is the tokens. A byte-level
BPE tokenizer reads " Jamaica" inside a sentence as ``ĠJ ama ica`` and "Jamaica" after
a quote as ``J ama ica``, so an unspaced call shares no first token with the question
it copies from, and a small policy, which copies by continuing what followed a token it
has seen, cannot continue past it. The spaced call is the question's own tokens. A name it
takes from an observation rather than the question (the country an ``airport()`` step
named) it writes as that observation does, for the same reason.

With ``batched`` the lookups of one indicator that follow each other in the gold path are
one call naming the countries as the question lists them
(``lookup(" Peru, Chile and Bolivia", "population")``): a span of the question, which a
small policy copies token by token, where three calls must each find where their name
starts ("Bolivia" after the question's second comma).
"""

from __future__ import annotations

import json
import random
import re

from rollout.tools.data import INDICATORS, fold

GIVE_UP = "unknown"
_NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
_LOOKED_UP = re.compile(rf"^(.{{1,80}}?): (\w{{1,40}}) = ({_NUMBER}) ", re.M)
_RESULT = re.compile(rf" = ({_NUMBER})\s*$")
_AIRPORT = re.compile(r'^[A-Z0-9]{3}: .*, in (.{1,80}?); lookup\("', re.M)


def call(name: str, *args: object) -> str:
    """``name("a", "b")``: the call dialect, strings JSON-quoted."""
    return f"{name}({', '.join(json.dumps(a, ensure_ascii=False) for a in args)})"


def _listed(names: list[str]) -> str:
    """ "A", "A and B", "A, B and C": a list as the templates' questions write it."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class ToolOracle:
    def __init__(self, task: dict, spaced_names: bool = False, batched: bool = False):
        self.task = task
        self.spaced_names = spaced_names
        self.batched = batched  # consecutive lookups of one indicator as one call
        self.plan = list(task["gold_path"])
        self.lookups = [s["args"] for s in task["gold_path"] if s["action"] == "lookup"]
        self.values: dict[tuple[str, str], str] = {}  # (folded country, indicator) -> number
        self.result: str | None = None  # the last calculate result
        self.last_value: str | None = None  # the last figure a lookup showed
        self.bridge: str | None = None  # the country the last airport() named
        self.answering = False

    def next(self, observation: str) -> str:
        """The model text for the next step, given the text of the last observation."""
        self._read(observation)
        self.answering = False
        if self.plan:
            step = self.plan.pop(0)
            args = step["args"]
            if step["action"] == "lookup":
                if self.bridge is not None and fold(self.bridge) == fold(args["country"]):
                    # a name an observation gave: written as it was shown
                    return call("lookup", self.bridge, args["indicator"])
                names = [args["country"]]
                while self.batched and self._same_lookup(args):
                    names.append(self.plan.pop(0)["args"]["country"])
                return call("lookup", self._name(_listed(names)), args["indicator"])
            if step["action"] == "list_countries":
                return call("list_countries", args["filter"])
            if step["action"] == "airport":
                return call("airport", self._name(args["code"]))
            if step["action"] == "calculate":
                expression = self._expression()
                if expression is not None:
                    return call("calculate", expression)
                self.plan = []
        self.answering = True
        answer = self._answer()
        if self.task.get("pick") and answer != GIVE_UP:
            answer = self._name(answer)
        return call("answer", answer)

    def _same_lookup(self, args: dict) -> bool:
        nxt = self.plan[0] if self.plan else None
        return (
            nxt is not None
            and nxt["action"] == "lookup"
            and nxt["args"]["indicator"] == args["indicator"]
        )

    def _name(self, country: str) -> str:
        return f" {country}" if self.spaced_names else country

    def _read(self, observation: str) -> None:
        for m in _LOOKED_UP.finditer(observation):
            self.values[(fold(m.group(1)), m.group(2))] = m.group(3)
            self.last_value = m.group(3)
        for m in _AIRPORT.finditer(observation):
            self.bridge = m.group(1).strip()
        first = observation.strip().splitlines()[:1]
        if first and not first[0].startswith("Error:"):
            m = _RESULT.search(first[0])
            if m and not _LOOKED_UP.match(first[0]):
                self.result = m.group(1)

    def _value(self, args: dict) -> str | None:
        return self.values.get((fold(args["country"]), args["indicator"]))

    def _expression(self) -> str | None:
        values = [self._value(a) for a in self.lookups]
        if any(v is None for v in values):
            return None
        return self.task["formula"].format(*values)

    def _answer(self) -> str:
        if self.task.get("formula"):
            if self.result is None:
                return GIVE_UP
            return self.result
        if not self.task.get("pick"):  # the answer is the figure looked up last
            return GIVE_UP if self.last_value is None else self._name(self.last_value)
        read = [(self._value(a), a["country"]) for a in self.lookups]
        if not read or any(v is None for v, _ in read):
            return GIVE_UP
        sign = 1 if self.task.get("pick", "highest") == "highest" else -1
        return max(read, key=lambda vc: sign * float(vc[0]))[1]


class NoisyToolOracle(ToolOracle):
    """The tool oracle with an imperfect agent's habits, for demonstrations with mistakes
    in them (``rollout.policy = "noisy_oracle"``, as the web modes' noisy oracle): each
    lookup reads another indicator than the plan's with probability ``p`` (and the episode
    answers from what it read), and with probability ``premature`` an episode whose first
    hop is ``airport()`` stops there and answers with the airport's country."""

    def __init__(
        self, task: dict, *, p: float = 0.35, premature: float = 0.0, seed: int = 0, **how
    ):
        super().__init__(task, **how)
        self.p = p
        self.rng = random.Random(seed)
        # drawn from a stream of its own, as the web modes' noisy oracle does
        self.premature = bool(premature) and random.Random(f"premature-{seed}").random() < premature

    def next(self, observation: str) -> str:
        if self.premature and self.plan and self.plan[0]["action"] != "airport":
            self._read(observation)
            if self.bridge is not None:
                self.plan, self.answering = [], True
                return call("answer", self.bridge)
        if self.plan and self.plan[0]["action"] == "lookup" and self.rng.random() < self.p:
            args = self.plan[0]["args"]
            wrong = self.rng.choice(sorted(set(INDICATORS) - {args["indicator"]}))
            self.plan[0] = {"action": "lookup", "args": {**args, "indicator": wrong}}
        return super().next(observation)
