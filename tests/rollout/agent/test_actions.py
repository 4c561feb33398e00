"""The action table: one source for the parser and the model's action description."""

import dataclasses
import re

import pytest

from rollout.agent.actions import (
    ACTIONS,
    MODES,
    Answer,
    Back,
    Click,
    ExtractText,
    Fill,
    Goto,
    Screenshot,
    Scroll,
    Search,
    SomClick,
    SomScroll,
    SomType,
    Visit,
    describe_actions,
    render_call,
    spec_for,
)
from rollout.agent.parser import parse

EXPECTED_NAMES = {
    "api": ["search", "visit", "answer"],
    "playwright": [
        "goto",
        "click",
        "fill",
        "scroll",
        "back",
        "forward",
        "observe",
        "extract_text",
        "screenshot",
        "answer",
    ],
    "som": ["click", "type", "scroll", "back", "forward", "observe", "goto", "answer"],
}


def rows():
    return [(mode, spec) for mode in MODES for spec in ACTIONS[mode]]


def test_each_mode_has_exactly_the_specified_actions():
    assert {m: [s.name for s in ACTIONS[m]] for m in MODES} == EXPECTED_NAMES


@pytest.mark.parametrize(("mode", "spec"), rows(), ids=lambda x: getattr(x, "name", x))
def test_every_example_parses_to_its_action(mode, spec):
    result = parse(spec.example, mode)
    assert result == spec.example_action
    assert type(result) is spec.cls


@pytest.mark.parametrize(("mode", "spec"), rows(), ids=lambda x: getattr(x, "name", x))
def test_table_parameters_are_the_dataclass_fields_in_order(mode, spec):
    fields = [f.name for f in dataclasses.fields(spec.cls) if f.name != "note"]
    assert [p.name for p in spec.params] == fields


@pytest.mark.parametrize("mode", MODES)
def test_the_description_lists_exactly_the_tables_actions(mode):
    text = describe_actions(mode)
    listed = re.findall(r"^- (\w+)\(", text, re.M)
    assert listed == [spec.name for spec in ACTIONS[mode]]
    for spec in ACTIONS[mode]:
        assert f"- {spec.signature()}: {spec.doc}" in text
        assert f"Example: {spec.example}" in text


def test_the_description_names_the_citation_syntax_and_allowed_hosts():
    text = describe_actions("api", ("127.0.0.1:8900", "localhost"))
    assert '"[1] URL"' in text
    assert "127.0.0.1:8900, localhost" in text
    assert "<search>...</search>" in text  # the short form is announced
    assert "click [3]" in describe_actions("som")


@pytest.mark.parametrize("mode", MODES)
def test_the_compact_description_lists_every_action_with_its_example(mode):
    text = describe_actions(mode, ("127.0.0.1:8900",), compact=True)
    listed = re.findall(r"^- (\w+)\(", text, re.M)
    assert listed == [spec.name for spec in ACTIONS[mode]]
    for spec in ACTIONS[mode]:
        assert f"- {spec.signature()}, e.g. {spec.example}" in text
    assert "127.0.0.1:8900" in text
    assert len(text) < 0.6 * len(describe_actions(mode, ("127.0.0.1:8900",)))


def test_describe_actions_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode"):
        describe_actions("vision")


def test_signatures_show_types_and_choices():
    assert spec_for("playwright", "fill").signature() == "fill(selector: str, value: str)"
    assert spec_for("playwright", "scroll").signature() == "scroll(dx: int, dy: int)"
    assert spec_for("som", "scroll").signature() == 'scroll(direction: "up" | "down")'
    assert spec_for("som", "back").signature() == "back()"
    assert spec_for("api", "answer").params[0].xml_tag == "answer"
    assert spec_for("api", "fill") is None


@pytest.mark.parametrize(
    ("action", "name", "args", "rendered"),
    [
        (Search("2024 US GDP"), "search", {"query": "2024 US GDP"}, 'search("2024 US GDP")'),
        (Visit("http://a/"), "visit", {"url": "http://a/"}, 'visit("http://a/")'),
        (Answer("Paris"), "answer", {"text": "Paris"}, 'answer("Paris")'),
        (Goto("http://a/"), "goto", {"url": "http://a/"}, 'goto("http://a/")'),
        (Click("#go"), "click", {"selector": "#go"}, 'click("#go")'),
        (Fill("#q", ""), "fill", {"selector": "#q", "value": ""}, 'fill("#q", "")'),
        (Scroll(0, -300), "scroll", {"dx": 0, "dy": -300}, "scroll(0, -300)"),
        (Back(), "back", {}, "back()"),
        (ExtractText("main"), "extract_text", {"selector": "main"}, 'extract_text("main")'),
        (Screenshot(), "screenshot", {}, "screenshot()"),
        (SomClick(3), "click", {"n": 3}, "click(3)"),
        (SomType(5, 'say "hi"'), "type", {"n": 5, "text": 'say "hi"'}, 'type(5, "say \\"hi\\"")'),
        (SomScroll("down"), "scroll", {"direction": "down"}, 'scroll("down")'),
    ],
)
def test_each_action_has_its_name_args_and_call_form(action, name, args, rendered):
    assert action.name == name
    assert action.args() == args
    assert action.render() == rendered


def test_the_note_is_not_part_of_equality_or_args():
    noted = Search("x", note="2 more actions were ignored")
    assert noted == Search("x")
    assert noted.note and "note" not in noted.args()
    with pytest.raises(dataclasses.FrozenInstanceError):
        noted.query = "y"  # type: ignore[misc]


def test_rendering_stays_on_one_line_and_can_be_cut():
    assert render_call("answer", {"text": "a\nb\u2028c\u2029d\x85e"}) == (
        'answer("a\\nb\\u2028c\\u2029d\\x85e")'
    )
    assert render_call("search", {"q": "abcdef"}, max_chars=3) == 'search("abc…")'
    assert render_call("answer", {"text": "naïve “quote”"}) == 'answer("naïve “quote”")'
