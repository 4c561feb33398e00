"""The action parser: a corpus of real-looking replies per mode, fuzzing, and its guarantees."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout.agent import dialects, parser
from rollout.agent.actions import ACTIONS, MODES, Action, Answer, Click, Search, SomClick, Visit
from rollout.agent.parser import MAX_REPLY_CHARS, ParseError, parse, strip_reasoning
from rollout.net.urls import UrlPolicy
from tests.rollout.parser_corpus import BASE, CORPUS, Err, More

pytestmark = pytest.mark.filterwarnings("error")  # hostile input must not even warn


def corpus_rows():
    return [
        pytest.param(mode, text, expected, id=f"{mode}-{i}")
        for mode, rows in CORPUS.items()
        for i, (text, expected) in enumerate(rows)
    ]


def test_the_corpus_has_at_least_sixty_replies_per_mode():
    assert {mode: len(rows) >= 60 for mode, rows in CORPUS.items()} == dict.fromkeys(MODES, True)


@pytest.mark.parametrize(("mode", "text", "expected"), corpus_rows())
def test_corpus(mode, text, expected):
    result = parse(text, mode, base_url=BASE)
    if isinstance(expected, Err):
        assert isinstance(result, ParseError), result
        assert result.kind == expected.kind, result.message
        for word in expected.words:
            assert word in result.message
    elif isinstance(expected, More):
        assert result == expected.action
        assert f"{expected.more} more action" in result.note
        assert "Write one action per reply" in result.note
    else:
        assert result == expected
        assert type(result) is type(expected)
        assert result.note == ""


# ----------------------------------------------------------------------------- behaviour


def test_the_note_names_the_action_that_ran():
    result = parse("<search>a</search><search>b</search><search>c</search>", "api")
    assert result == Search("a")
    assert result.note == (
        'Only the first action of your reply was run (search("a")); '
        "2 more actions were ignored. Write one action per reply."
    )


def test_only_the_modes_own_actions_are_accepted():
    assert parse('click("#a")', "playwright") == Click("#a")
    assert parse('click("#a")', "som").kind == "bad_argument"  # som's click takes a number
    assert parse("click(3)", "som") == SomClick(3)
    assert parse("<action>click</action><selector>#a</selector>", "api").kind == "unknown_action"
    assert parse('type(5, "x")', "playwright").kind == "unknown_action"


def test_urls_are_checked_against_the_given_policy():
    policy = UrlPolicy(("example.org",))
    assert parse("<visit>https://example.org/a</visit>", "api", policy) == Visit(
        "https://example.org/a"
    )
    refused = parse("<visit>http://127.0.0.1:8900/</visit>", "api", policy)
    assert refused.kind == "refused_url" and "example.org" in refused.message


def test_a_relative_url_needs_the_current_page():
    assert parse("<visit>/wiki/X</visit>", "api").kind == "refused_url"
    assert parse("<visit>/wiki/X</visit>", "api", base_url=BASE) == Visit(
        "http://127.0.0.1:8900/wiki/X"
    )


def test_an_unknown_mode_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown mode"):
        parse("click(3)", "vision")


def test_bytes_and_non_text_do_not_raise():
    assert parse(b"<answer>caf\xc3\xa9</answer>", "api") == Answer("café")
    assert parse(b"\xff\xfe<answer>x</answer>", "api") == Answer("x")
    assert parse(None, "api").kind == "no_action"  # type: ignore[arg-type]


def test_length_limit():
    assert parse("<answer>x</answer>" + " " * (MAX_REPLY_CHARS - 18), "api") == Answer("x")
    assert parse(" " * (MAX_REPLY_CHARS + 1), "api").kind == "too_long"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "text",
    [
        "(" * 100_000,
        "click(" + "[" * 5000 + "]" * 5000 + ")",
        "click(" + "(" * 199 + "1" + ")" * 200,
        'answer("' + "\\" * 10_001 + '")',
        "<" * 100_000,
        "<action>" * 20_000,
        "<think>" * 20_000 + "</think>" * 19_999,
        "```" * 30_000,
        "click [" * 20_000,
        "goto(" + "'x'," * 10_000 + ")",
        "scroll(0, " + "9" * 5000 + ")",
        "answer(" + "-" * 10_000 + "1)",
        "\x00" * 50_000,
        "\ud800<answer>x</answer>click(\udfff)",
        "<search>" + "a" * 200_000,
    ],
    ids=lambda t: f"{t[:12]!r}x{len(t)}",
)
def test_pathological_replies_return_quickly_without_raising(mode, text):
    result = parse(text, mode)
    assert isinstance(result, Action | ParseError)
    assert not isinstance(result, ParseError) or result.kind != "internal", result.message


def test_a_call_longer_than_the_limit_is_refused_with_the_reason():
    result = parse('answer("' + "a" * dialects.MAX_CALL_CHARS + '")', "playwright")
    assert result.kind == "syntax" and "longer than 64000 characters" in result.message
    fits = parse('answer("' + "a" * 60_000 + '")', "playwright")
    assert fits == Answer("a" * 60_000)


def test_a_bug_inside_the_parser_becomes_an_internal_parse_error(monkeypatch):
    def broken(text, mode):
        raise IndexError("boom")

    monkeypatch.setitem(parser._READERS, "xml", broken)  # api mode's dialect
    result = parse("<search>x</search>", "api")
    assert result.kind == "internal" and "IndexError" in result.message


@pytest.mark.parametrize(
    ("text", "body", "unclosed"),
    [
        ("a<think>b</think>c", "ac", False),
        ("<THINK>b</Think>c<think>d</think>e", "ce", False),
        ("before</think>after", "after", False),  # the prompt opened the block
        ("a<think>b<think>c</think>d", "ad", False),  # nested opening tags
        ("a<think>never closed", "a", True),
        ("<thinking>x</thinking>y", "y", False),
        ("no reasoning", "no reasoning", False),
    ],
)
def test_strip_reasoning(text, body, unclosed):
    assert strip_reasoning(text) == (body, unclosed)


# ----------------------------------------------------------------------------- fuzzing

_TOKENS = [
    "<action>", "</action>", "<search>", "</search>", "<visit>", "</visit>", "<answer>",
    "</answer>", "<query>", "</query>", "<url>", "</url>", "<think>", "</think>", "```",
    "```python\n", "(", ")", "[", "]", '"', "'", '"""', "\\", "“", "”", "‘", "’", "\n", " ",
    ",", "=", "*", "**", "click", "type", "scroll", "goto", "fill", "answer", "back()",
    "page.", "await ", "search", "http://", "https://127.0.0.1:8900/", "javascript:", "//",
    "@", "#", "%", "%2e", "\x00", "\ud800", "0x", "1e999", "10**9", "lambda:", "f'", "j",
    "down", "UP", "[3]", "<", ">", "/", ":",
]  # fmt: skip


_CHARS = "".join(sorted(set("".join(_TOKENS)))) + "abcXYZ0123456789\t\r\x85\u2028é"


def _seeds(mode):
    return [text for text, _ in CORPUS[mode] if len(text) < 2000] + [
        spec.example for spec in ACTIONS[mode]
    ]


def _mutate(text: str, rng: random.Random) -> str:
    """One to four edits of the kinds generation goes wrong in."""
    for _ in range(rng.randint(1, 4)):
        i = rng.randint(0, len(text))
        j = rng.randint(i, min(len(text), i + 12))
        op = rng.randrange(5)
        if op == 0:
            text = text[:i] + text[j:]  # a span lost
        elif op == 1:
            text = text[:i] + rng.choice(_TOKENS) + text[i:]  # a stray token
        elif op == 2:
            text = text[:j] + text[i:j] + text[j:]  # a span repeated
        elif op == 3:
            text = text[:i] + text[i:j].swapcase() + text[j:]
        else:
            text = text[:i]  # generation cut off
    return text


def _reply(mode: str, rng: random.Random) -> str:
    """A mutated corpus reply, a soup of dialect tokens, or random characters."""
    kind = rng.random()
    if kind < 0.6:
        return _mutate(rng.choice(_seeds(mode)), rng)
    if kind < 0.8:
        return "".join(rng.choices(_TOKENS, k=rng.randint(0, 12)))
    return "".join(rng.choices(_CHARS, k=rng.randint(0, 80)))


def _never_raises(mode, text):
    result = parse(text, mode, base_url=BASE)
    assert isinstance(result, Action | ParseError)
    if isinstance(result, ParseError):
        assert result.kind != "internal", (text, result.message)
        assert result.message


# 10,000 replies per dialect: each example is one seeded reply, which keeps an example
# cheap (hypothesis' own text strategies cost ~1 ms each); the test below adds
# hypothesis-native text for its edge-case search.
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=10_000)
@given(seed=st.integers(0, 2**64 - 1))
def test_ten_thousand_random_and_mutated_replies_never_raise(mode, seed):
    _never_raises(mode, _reply(mode, random.Random(seed)))


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=1_000)
@given(
    text=st.one_of(
        st.text(st.sampled_from(_CHARS), max_size=80),
        st.lists(st.sampled_from(_TOKENS), max_size=12).map("".join),
        st.text(max_size=40),
    )
)
def test_hypothesis_text_never_raises(mode, text):
    _never_raises(mode, text)


def test_readers_bound_the_candidates_they_try():
    # 1000 prose mentions that are not valid calls, then a real one past the bound
    text = "I will click (the link) now.\n" * 1000 + 'click("#x")'
    assert dialects.MAX_CANDIDATES < 1000
    result = dialects.read_call(text, "playwright")
    assert isinstance(result, ParseError) and result.kind == "syntax"
    assert parse('I will click (the link) now.\nclick("#x")', "playwright") == Click("#x")
