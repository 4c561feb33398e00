"""The generic parser on the tools table: the dialect's corpus, the table's examples, fuzzing."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.agent.actions import Action, describe_actions
from rollout.agent.parser import ParseError, parse
from rollout.tools import ACTIONS
from tests.rollout.parser_corpus import Err, More
from tests.rollout.tools.tools_corpus import TOOLS

pytestmark = pytest.mark.filterwarnings("error")  # hostile input must not even warn


def test_the_corpus_has_at_least_sixty_replies():
    assert len(TOOLS) >= 60


@pytest.mark.parametrize(("text", "expected"), TOOLS, ids=[str(i) for i in range(len(TOOLS))])
def test_corpus(tools_mode, text, expected):
    result = parse(text, tools_mode)
    if isinstance(expected, Err):
        assert isinstance(result, ParseError), result
        assert result.kind == expected.kind, result.message
        for word in expected.words:
            assert word in result.message
    elif isinstance(expected, More):
        assert result == expected.action
        assert f"{expected.more} more action" in result.note
    else:
        assert result == expected
        assert type(result) is type(expected)
        assert result.note == ""


def test_every_example_parses_to_its_action(tools_mode):
    for spec in ACTIONS:
        assert parse(spec.example, tools_mode) == spec.example_action


def test_the_description_lists_every_tool(tools_mode):
    text = describe_actions(tools_mode)
    for spec in ACTIONS:
        assert spec.signature() in text and spec.example in text
    assert "URLs" not in text
    compact = describe_actions(tools_mode, compact=True)
    assert all(spec.example in compact for spec in ACTIONS)


# ----------------------------------------------------------------------------- fuzzing

_TOKENS = [
    "lookup", "list_countries", "calculate", "answer", "(", ")", '"', "'", '"""', "\\",
    "“", "”", ",", "=", "*", "**", "\n", " ", "```", "```python\n", "<think>", "</think>",
    "country=", "indicator=", "expression=", "filter=", "France", "population", "gdp_ppp",
    "3162000000000 / 66987244", "1e999", "10**9", "__import__", "lambda:", "[", "]",
    "prefix:", "Europe", "0x", "j", "\x00", "\ud800", "%", "#",
]  # fmt: skip
_CHARS = "".join(sorted(set("".join(_TOKENS)))) + "abcXYZ0123456789\t\r\x85\u2028é"


def _seeds():
    return [text for text, _ in TOOLS if len(text) < 2000] + [spec.example for spec in ACTIONS]


def _mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        i = rng.randint(0, len(text))
        j = rng.randint(i, min(len(text), i + 12))
        op = rng.randrange(5)
        if op == 0:
            text = text[:i] + text[j:]
        elif op == 1:
            text = text[:i] + rng.choice(_TOKENS) + text[i:]
        elif op == 2:
            text = text[:j] + text[i:j] + text[j:]
        elif op == 3:
            text = text[:i] + text[i:j].swapcase() + text[j:]
        else:
            text = text[:i]
    return text


def _reply(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        return _mutate(rng.choice(_seeds()), rng)
    if kind < 0.8:
        return "".join(rng.choices(_TOKENS, k=rng.randint(0, 12)))
    return "".join(rng.choices(_CHARS, k=rng.randint(0, 80)))


def _never_raises(mode, text):
    result = parse(text, mode)
    assert isinstance(result, Action | ParseError)
    if isinstance(result, ParseError):
        assert result.kind != "internal", (text, result.message)
        assert result.message


@settings(max_examples=3000, deadline=None)
@given(seed=st.integers(0, 2**64 - 1))
def test_random_and_mutated_replies_never_raise(tools_mode, seed):
    _never_raises(tools_mode, _reply(random.Random(seed)))


@settings(max_examples=500, deadline=None)
@given(
    text=st.one_of(
        st.text(st.sampled_from(_CHARS), max_size=80),
        st.lists(st.sampled_from(_TOKENS), max_size=12).map("".join),
        st.text(max_size=40),
    )
)
def test_hypothesis_text_never_raises(tools_mode, text):
    _never_raises(tools_mode, text)
