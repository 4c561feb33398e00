"""Scripted policies that write model text, so the parser and the whole harness are exercised.

:class:`OraclePolicy` follows a task's gold path in the mode's dialect and then
answers only with what it read: it looks for each evidence quote and for the
answer in its own observations, and gives up (answers "unknown") when they are
not there. Its success therefore shows that the observations carry the
evidence, not that the oracle knows the answer. With ``shortcut`` it answers as
soon as everything it needs is in what it has read (a search result's snippet
often carries the evidence), skipping the rest of the gold path. With
``query="question"`` it searches with the question as asked instead of the gold
path's keywords. With ``article`` it answers with the article its evidence puts
before the answer ("the Asia/Kolkata" from "... is in the Asia/Kolkata time
zone"): the same answer under the SQuAD normalisation, and one a small policy can
copy from the page, since the page has the same word before it. With ``heading`` it
answers a name the page in view has as its heading line ("# Vero Beach") as that line
writes it: the same answer under the normalisation (punctuation is dropped), and the
mark before it is the anchor a small policy continues from.
"""

from __future__ import annotations

import json
import random
import re
from urllib.parse import quote_plus, urldefrag

from rollout.registry import envs
from rollout.web.text import normalize_space

GIVE_UP = "unknown"
MAX_SCROLLS = 12  # som mode: screens to scroll through looking for the evidence


def _fold(text: str) -> str:
    return normalize_space(text).lower()


class OraclePolicy:
    def __init__(
        self,
        task: dict,
        mode: str,
        web_url: str,
        *,
        shortcut: bool = False,
        query: str = "gold",
        article: bool = False,
        heading: bool = False,
    ):
        if query not in ("gold", "question"):
            raise ValueError(f"query must be 'gold' or 'question', not {query!r}")
        self.task, self.mode, self.web = task, mode, web_url.rstrip("/")
        self.shortcut, self.query, self.article = shortcut, query, article
        self.heading = heading
        self.answering = False  # the last text returned is an answer
        self.plan = list(task["gold_path"])
        self.seen: list[str] = []
        self.pending_quote: str | None = None
        self.pending_click: int | None = None  # som: the search button, after typing
        self.last_view = ""
        self.scrolls = 0

    # ------------------------------------------------------------------ the dialects

    def _call(self, name: str, *args: object) -> str:
        if self.mode == "api":
            # The short form, with a space before the argument: a name copied from running
            # text ("code FAI", "serving Posadas,") keeps the same tokens (" F", " P").
            return f"<{name}> {args[0]}</{name}>"
        return f"{name}({', '.join(json.dumps(a, ensure_ascii=False) for a in args)})"

    def _search(self, query: str) -> str:
        if self.mode == "api":
            return self._call("search", query)
        box = _SEARCH_FORM.search(self.last_view) if self.mode == "som" else None
        if box is not None and self.query == "question":
            # The page's own search form: type the question as asked (a copy of the
            # prompt's text), then press its button.
            self.pending_click = int(box.group(2))
            return self._call("type", int(box.group(1)), query)
        return self._call("goto", f"{self.web}/search?q={quote_plus(query)}")

    def _visit(self, url: str) -> str:
        return self._call("visit" if self.mode == "api" else "goto", url)

    # ------------------------------------------------------------------ acting

    def next(self, observation: str) -> str:
        """The model text for the next step, given the text of the last observation."""
        self.seen.append(_fold(observation))
        self.last_view = observation
        self.answering = False
        if self.pending_click is not None:
            n, self.pending_click = self.pending_click, None
            return self._call("click", n)
        if self.shortcut and len(self.seen) > 1 and self._answer() != GIVE_UP:
            self.plan = []  # the evidence and the answer are in view: no need to go on
        missing = self._missing_quote()
        if missing is not None and self.pending_quote is not None:
            extra = self._look_further(missing)
            if extra is not None:
                return extra
        if self.plan:
            if self.plan[0]["action"] == "next_page":
                return self._next_page(self.plan.pop(0)["args"]["url"])
            step = self.plan.pop(0)
            if step["action"] == "visit":
                self.pending_quote = self._quote_for(step["args"]["url"])
                self.scrolls = 0
                data = step["args"].get("data")
                if data and self.mode == "api":  # no JavaScript: read the panel's source
                    return self._visit(data)
                return self._visit(step["args"]["url"])
            self.pending_quote = None
            if self.query == "question":
                return self._search(self.task["question"])
            return self._search(step["args"]["query"])
        self.answering = True
        return self._call("answer", self._answer())

    def _next_page(self, url: str) -> str:
        """Follow a page's "Next page" (a list's) or "Next: ..." (a city's) link: by its URL
        in api mode, by clicking it in the browser modes (som: by its number, scrolling down
        until the link is in view)."""
        self.pending_quote = None
        if self.mode == "api":
            return self._visit(url)
        if self.mode == "playwright":
            return self._call("click", 'a[rel="next"]')
        link = _NEXT_LINK.search(self.last_view)
        if link is not None:
            self.scrolls = 0
            return self._call("click", int(link.group(1)))
        if self.scrolls < MAX_SCROLLS:
            self.scrolls += 1
            self.plan.insert(0, {"action": "next_page", "args": {"url": url}})
            return self._call("scroll", "down")
        return self._call("goto", url)  # never reached on the local web's lists

    def _quote_for(self, url: str) -> str | None:
        page = urldefrag(url).url
        quotes = [e["quote"] for e in self.task["evidence"] if e["url"] == page]
        return quotes[0] if quotes else None

    def _missing_quote(self) -> str | None:
        if self.pending_quote is None or _fold(self.pending_quote) in self.seen[-1]:
            return None
        return self.pending_quote

    def _look_further(self, quote: str) -> str | None:
        """The evidence is on the page but not in view: read further, as a reader would."""
        if self.mode == "playwright" and self.scrolls == 0:
            self.scrolls += 1
            words = json.dumps(quote[:60])
            return self._call("extract_text", f"text={words}")
        if self.mode == "som" and self.scrolls < MAX_SCROLLS:
            self.scrolls += 1
            return self._call("scroll", "down")
        return None

    def _answer(self) -> str:
        read = "\n".join(self.seen)
        quotes_seen = all(_fold(e["quote"]) in read for e in self.task["evidence"])
        facts = self.task.get("key_facts") or [self.task["answer"]]
        if self.task.get("derived"):
            facts = []  # a count or a sum: computed from the evidence, not quoted by a page
        if not quotes_seen or not all(_fold(f) in read for f in facts):
            return GIVE_UP
        answer = self.task["answer"]
        if self.article:
            answer = _with_article(answer, [e["quote"] for e in self.task["evidence"]])
        if self.heading:
            answer = _as_heading(answer, self.last_view)
        if self.task["type"] == "citation":
            urls = dict.fromkeys(e["url"] for e in self.task["evidence"])
            answer += "\n" + "\n".join(f"[{i}] {u}" for i, u in enumerate(urls, 1))
        return answer


class NoisyOraclePolicy(OraclePolicy):
    """The oracle, but each decision is wrong with probability ``p``, plausibly so: it
    opens another result from its last search, or answers with another name it read.

    Its episodes succeed sometimes and fail sometimes, which makes it a source of
    imperfect demonstrations (and of groups with reward variance)."""

    def __init__(
        self,
        task: dict,
        mode: str,
        web_url: str,
        *,
        p: float = 0.35,
        seed: int = 0,
        premature: float = 0.0,
        give_up: float = 0.0,
        shortcut: bool = False,
        query: str = "gold",
        article: bool = False,
        heading: bool = False,
    ):
        super().__init__(
            task, mode, web_url, shortcut=shortcut, query=query, article=article, heading=heading
        )
        self.p = p
        self.rng = random.Random(seed)
        # one hop short this episode: drawn from a stream of its own, so the other
        # mistakes' draws are the same for a given seed whatever ``premature`` is
        short = premature and random.Random(f"premature-{seed}").random() < premature
        self.bridge = _bridge(task) if short else None
        # gives up at once, before it has read anything: a stream of its own as well
        self.quit = bool(give_up) and random.Random(f"give-up-{seed}").random() < give_up

    def next(self, observation: str) -> str:
        self.last_view = observation  # its mistakes come from this view
        if self.quit:
            self.quit, self.plan, self.answering = False, [], True
            self.seen.append(_fold(observation))
            return self._call("answer", GIVE_UP)
        if self.pending_click is not None:  # a search typed: press its button first
            return super().next(observation)
        if self.bridge is not None and self._bridge_in_view(observation):
            self.seen.append(_fold(observation))
            self.plan, self.answering = [], True
            return self._call("answer", self.bridge)
        if self.plan and self.plan[0]["action"] == "visit" and self.rng.random() < self.p:
            wrong = self._other_url(self.plan[0]["args"]["url"])
            if wrong is not None:
                self.plan.pop(0)
                self.seen.append(_fold(observation))
                return self._visit(wrong)
        text = super().next(observation)
        if self.answering and self.rng.random() < self.p:
            name = self._other_name()
            if name is not None:
                return self._call("answer", name)
        return text

    def _bridge_in_view(self, observation: str) -> bool:
        """The first evidence is in this view and the last has not been read."""
        first, last = self.task["evidence"][0]["quote"], self.task["evidence"][-1]["quote"]
        read = "\n".join(self.seen)
        return _fold(first) in _fold(observation) and _fold(last) not in read + _fold(observation)

    def _other_url(self, right: str) -> str | None:
        """Another link from the last view: not the right one, nor the page in view (its
        ``URL:`` header), which would only reload what was just read."""
        here = _HERE.search(self.last_view)
        skip = {urldefrag(right).url, urldefrag(here.group(1)).url if here else None}
        urls = [u for u in _URL.findall(self.last_view) if urldefrag(u).url not in skip]
        return self.rng.choice(urls) if urls else None

    def _other_name(self) -> str | None:
        names = {n for n in _NAME.findall(self.last_view) if _fold(n) != _fold(self.task["answer"])}
        return self.rng.choice(sorted(names)) if names else None


def _bridge(task: dict) -> str | None:
    """The entity a multi-hop task's first evidence leads to: the task's ``bridge`` when it
    names one, else the last name in its quote ("... serving Mykonos Island, Greece." ->
    "Greece"); None for one hop, or when the quote names nothing or names the answer
    itself."""
    if len(task.get("evidence") or ()) < 2:
        return None
    if task.get("bridge"):  # named by the task ("Next: Le Bouscat" -> "Le Bouscat")
        return task["bridge"]
    names = _NAME.findall(task["evidence"][0]["quote"])
    if not names or _fold(names[-1]) == _fold(task["answer"]):
        return None
    return names[-1]


def oracle_factory(mode: str):
    """The in-tree modes' scripted oracle, as an environment kind's ``oracle``
    (:class:`rollout.registry.EnvKind`): ``make(task, web_url, rollout, *, noisy, seed)``
    is an :class:`OraclePolicy`, or with ``noisy`` a :class:`NoisyOraclePolicy` wrong
    with probability ``rollout.oracle_noise``."""

    def make(task: dict, web_url: str, rollout, *, noisy: bool = False, seed: int = 0):
        how = oracle_options(rollout)
        if noisy:
            return NoisyOraclePolicy(
                task, mode, web_url, p=rollout.oracle_noise, seed=seed,
                premature=rollout.oracle_premature, give_up=rollout.oracle_give_up, **how,
            )  # fmt: skip
        return OraclePolicy(task, mode, web_url, **how)

    return make


def scripted_oracle(
    kind: str, task: dict, web_url: str, rollout, *, noisy: bool = False, seed: int = 0
):
    """The scripted oracle of the environment kind ``kind`` (``rollout.policy = "oracle"``,
    ``"noisy_oracle"``, ``rollout.eval --policy oracle``): an object whose ``next(text)``
    writes the next model text. ValueError when the kind brings no oracle."""
    entry = envs.get(kind)
    if entry.oracle is None:
        raise ValueError(
            f"environment kind {kind!r} has no scripted oracle; use rollout.policy = 'model'"
        )
    return entry.oracle(task, web_url, rollout, noisy=noisy, seed=seed)


def oracle_options(rollout) -> dict:
    """The oracles' keyword arguments from a ``RolloutConfig`` (``rollout.oracle_*``)."""
    return {
        "shortcut": rollout.oracle_shortcut,
        "query": rollout.oracle_query,
        "article": rollout.oracle_article,
        "heading": rollout.oracle_heading,
    }


def _with_article(answer: str, quotes: list[str]) -> str:
    """``answer`` with the article that precedes it in the first quote that has one."""
    for quote in quotes:
        m = re.search(r"\b(the|an|a)\s+" + re.escape(answer) + r"(?!\w)", quote, re.I)
        if m:
            return f"{m.group(1)} {answer}"
    return answer


def _as_heading(answer: str, view: str) -> str:
    """``answer`` as the heading line of ``view`` writes it ("# Vero Beach"), when the view
    has one that is the answer alone; else ``answer`` unchanged."""
    m = re.search(r"^(#{1,6})[ \t]+" + re.escape(answer) + r"[ \t]*$", view, re.M)
    return f"{m.group(1)} {answer}" if m else answer


_SEARCH_FORM = re.compile(r'\[(\d+)\] searchbox "Search query"[^\n\[]*\[(\d+)\] button "Search"')
_NEXT_LINK = re.compile(r'\[(\d+)\] link "Next(?: page|: [^"]+)"')  # a list's, a city's
_URL = re.compile(r"https?://[^\s)\"'<>]+")
_HERE = re.compile(r"^URL: (\S+)", re.M)
_NAME = re.compile(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)?\b")
