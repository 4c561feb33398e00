"""Reward verifiers: hand-derived scores for every task type, format tiers and anti-cheat."""

import pytest

from rollout.tracking.records import EpisodeRecord, Step
from rollout.verifiers import (
    AntiCheatConfig,
    CitationConfig,
    FormatConfig,
    JudgeVerdict,
    TaskError,
    VerifierConfig,
    verify,
)
from rollout.verifiers.citations import split_citations, url_key
from rollout.verifiers.reward import format_tiers
from rollout.verifiers.text import contains, exact_match, normalize_answer, token_f1

SITE = "http://127.0.0.1:8900"
NO_FORMAT = FormatConfig(weight=0.0)
NO_CHEATS = AntiCheatConfig(zero_on=())
PLAIN = VerifierConfig(format=NO_FORMAT, anticheat=NO_CHEATS)  # task scores alone


def step(i, action, args=None, observation="", url=None, page_text=None, error=None):
    return Step(
        i, f"raw {i}", action, args or {}, observation, url=url, page_text=page_text, error=error
    )


def record(*steps, task=None):
    return EpisodeRecord("e1", task or {}, "api", steps=list(steps))


def researched():
    """A search then a visit: enough tool use for any task."""
    return record(
        step(1, "search", {"query": "q"}, "1. Some page"),
        step(2, "visit", {"url": f"{SITE}/wiki/A"}, "text", url=f"{SITE}/wiki/A", page_text="text"),
    )


QA = {
    "id": "train-qa-000042",
    "question": "In which year was the Eiffel Tower completed?",
    "answer": "1889",
    "aliases": ["eighteen eighty-nine"],
    "type": "qa",
    "hops": 1,
}

# ----------------------------------------------------------------------------- text


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("The Cat, sat!", "cat sat"),
        ("  A  an   THE apple ", "apple"),
        ("U.S.A.", "usa"),  # punctuation is removed, not replaced by a space
        ("“Paris”", "paris"),  # Unicode punctuation too
        ("theatre another", "theatre another"),  # articles only as whole words
        ("$28.5T", "285t"),
        ("eighteen eighty-nine", "eighteen eightynine"),
    ],
)
def test_normalize_answer(text, normal):
    assert normalize_answer(text) == normal


@pytest.mark.parametrize(
    ("pred", "gold", "f1"),
    [
        # pred [cat, sat], gold [cat]: overlap 1, P=1/2, R=1/1, F1=2*0.5*1/1.5=0.667
        ("the cat sat", "cat", 2 / 3),
        # [barack, obama] vs [obama]: overlap 1, P=1/2, R=1 -> 0.667
        ("Barack Obama", "Obama", 2 / 3),
        # [new, york, city] vs [new, york]: overlap 2, P=2/3, R=1, F1=2*(2/3)/(5/3)=0.8
        ("New York City", "New York", 0.8),
        # [red, red, blue] vs [red, blue, blue]: multiset overlap red 1 + blue 1 = 2,
        # P=2/3, R=2/3, F1=2/3 (a set overlap would wrongly give 2/2 and 1.0)
        ("red red blue", "red blue blue", 2 / 3),
        # [it, was, completed, in, 1889] vs [1889]: P=1/5, R=1, F1=2*0.2/1.2=0.333
        ("It was completed in 1889", "1889", 1 / 3),
        ("Paris", "London", 0.0),  # no overlap
        ("the", "Paris", 0.0),  # prediction normalises to nothing
        ("", "", 1.0),  # SQuAD: both empty agree
        ("The Eiffel Tower.", "eiffel tower", 1.0),
    ],
)
def test_token_f1(pred, gold, f1):
    assert token_f1(pred, gold) == pytest.approx(f1)


def test_exact_match_and_containment():
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert contains("In 1903, she won.", "1903")
    assert not contains("In 19031 she won.", "1903")  # word boundaries
    assert not contains("concatenate", "cat")
    assert not contains("anything", "the")  # a needle that normalises to nothing


# ----------------------------------------------------------------------------- qa / browse_comp


@pytest.mark.parametrize(
    ("metric", "answer", "value", "em", "f1"),
    [
        ("em", "1889", 1.0, 1.0, 1.0),
        ("em", "1889.", 1.0, 1.0, 1.0),
        ("em", "Eighteen eighty-nine", 1.0, 1.0, 1.0),  # an alias
        ("em", "It was completed in 1889", 0.0, 0.0, 1 / 3),  # F1 as derived above
        ("f1", "It was completed in 1889", 1 / 3, 0.0, 1 / 3),
        ("f1", "1887", 0.0, 0.0, 0.0),
        ("em", f"1889\n[1] {SITE}/wiki/Eiffel_Tower", 1.0, 1.0, 1.0),  # citations ignored
    ],
)
def test_qa(metric, answer, value, em, f1):
    config = VerifierConfig(qa_metric=metric, format=NO_FORMAT, anticheat=NO_CHEATS)
    reward = verify(QA, answer, researched(), config)
    assert reward.value == pytest.approx(value)
    assert reward.breakdown["em"] == em
    assert reward.breakdown["f1"] == pytest.approx(f1)


def test_qa_takes_the_best_alias_per_metric():
    task = {**QA, "answer": "Barack Obama", "aliases": ["Obama"], "question": "Who?"}
    # F1 vs "Barack Obama": [obama] vs [barack, obama] -> P=1, R=1/2, F1=0.667; vs "Obama": 1.0
    assert verify(task, "Obama", researched(), PLAIN).breakdown["f1"] == 1.0


def test_browse_comp_is_normalised_exact_match():
    task = {**QA, "type": "browse_comp", "answer": "Ada Lovelace", "aliases": ["Augusta Ada King"]}
    assert verify(task, "ada lovelace.", researched(), PLAIN).value == 1.0
    assert verify(task, "Augusta Ada King", researched(), PLAIN).value == 1.0
    assert verify(task, "Lovelace", researched(), PLAIN).value == 0.0  # no partial credit


# ----------------------------------------------------------------------------- citation

CITATION = {
    **QA,
    "id": "train-citation-000007",
    "type": "citation",
    "evidence": [{"url": f"{SITE}/wiki/Eiffel_Tower", "quote": "completed in 1889"}],
}


def visit(i, path, page_text, requested=None):
    """A visit of ``requested`` (default: the same page) that landed on ``path``."""
    args = {"url": f"{SITE}{requested or path}"}
    return step(i, "visit", args, "page", url=f"{SITE}{path}", page_text=page_text)


def cited_record():
    return record(
        step(1, "search", {"query": "eiffel"}, "results"),
        visit(2, "/wiki/Eiffel_Tower", "The tower was completed in 1889.", "/wiki/Eiffel"),
        visit(3, "/wiki/Paris", "Paris is the capital of France."),
        visit(4, "/wiki/Gustave_Eiffel", "His company completed in 1889 the tower."),
        visit(5, "/wiki/Stored", None),  # the page text was not recorded
    )


def cite(*paths, text="1889"):
    return text + "".join(f"\n[{i}] {SITE}{p}" for i, p in enumerate(paths, 1))


@pytest.mark.parametrize(
    ("answer", "value", "cited", "supported", "unvisited"),
    [
        # 1 cited, 1 supported: 1 x 1/1
        (cite("/wiki/Eiffel_Tower"), 1.0, 1, 1, 0),
        # the requested URL of a redirected visit counts as visited too
        (cite("/wiki/Eiffel"), 1.0, 1, 1, 0),
        # visited but without the quote: 1 x 1/2
        (cite("/wiki/Eiffel_Tower", "/wiki/Paris"), 0.5, 2, 1, 0),
        # a never-visited page cancels one supported page: max(0, (1 - 1*1) / 2) = 0
        (cite("/wiki/Eiffel_Tower", "/wiki/Fake"), 0.0, 2, 1, 1),
        # (2 - 1) / 3 = 0.333
        (cite("/wiki/Eiffel_Tower", "/wiki/Gustave_Eiffel", "/wiki/Fake"), 1 / 3, 3, 2, 1),
        # page text not recorded: visited, unsupported: 0 / 1
        (cite("/wiki/Stored"), 0.0, 1, 0, 0),
        # the same page twice (case, fragment, trailing slash) counts once
        (cite("/wiki/Eiffel_Tower", "/wiki/Eiffel_Tower/#history"), 1.0, 1, 1, 0),
        # wrong answer: 0 x 1
        (cite("/wiki/Eiffel_Tower", text="1887"), 0.0, 1, 1, 0),
        # no citation at all scores 0
        ("1889", 0.0, 0, 0, 0),
        # a bare URL in the text is a citation
        (f"1889 (source: {SITE}/wiki/Eiffel_Tower).", 1.0, 1, 1, 0),
    ],
)
def test_citation(answer, value, cited, supported, unvisited):
    reward = verify(CITATION, answer, cited_record(), PLAIN)
    assert reward.value == pytest.approx(value)
    b = reward.breakdown
    assert (b["cited"], b["supported"], b["unvisited"]) == (cited, supported, unvisited)


def test_the_unvisited_penalty_is_configurable():
    config = VerifierConfig(
        citation=CitationConfig(unvisited_penalty=0.0), format=NO_FORMAT, anticheat=NO_CHEATS
    )
    # (1 - 0*1) / 2 = 0.5: a fabricated citation then costs only its share
    answer = cite("/wiki/Eiffel_Tower", "/wiki/Fake")
    assert verify(CITATION, answer, cited_record(), config).value == 0.5


def test_split_citations():
    body, urls = split_citations(
        f"The tower [1] opened in 1889 (see {SITE}/wiki/A_(x)).\n\nSources:\n"
        f"[1] {SITE}/wiki/Eiffel_Tower — Wikipedia\n[2]: {SITE}/wiki/B,"
    )
    assert body == "The tower opened in 1889 (see )."
    assert urls == [f"{SITE}/wiki/Eiffel_Tower", f"{SITE}/wiki/B", f"{SITE}/wiki/A_(x)"]


def test_url_key():
    assert url_key("HTTP://LOCALHOST:80/a/#x") == "http://localhost/a"
    assert url_key("http://h:8900/a?q=1") == "http://h:8900/a?q=1"
    assert url_key("https://h") == "https://h/"


# ----------------------------------------------------------------------------- multi_doc

MULTI = {
    "id": "train-multi_doc-000003",
    "question": "Summarise Marie Curie's first Nobel Prize.",
    "answer": "Marie Curie won the 1903 Nobel Prize in Physics.",
    "type": "multi_doc",
    "hops": 2,
    "key_facts": ["Marie Curie", "1903", "Nobel Prize in Physics"],
}


@pytest.mark.parametrize(
    ("answer", "coverage"),
    [
        ("In 1903 Marie Curie shared the Nobel Prize in Physics.", 1.0),  # 3 of 3
        # "marie curie" yes, "1903" no, "nobel prize in physics" no ("nobel prize in 1911"): 1/3
        ("Marie Curie won a Nobel Prize in 1911.", 1 / 3),
        ("Pierre Curie, 19031.", 0.0),  # containment is on word boundaries
    ],
)
def test_multi_doc_key_fact_coverage(answer, coverage):
    reward = verify(MULTI, answer, researched(), PLAIN)
    assert reward.value == pytest.approx(coverage)
    assert reward.breakdown["judge_used"] is False


def test_multi_doc_mixes_in_a_judge_verdict():
    answer = "Marie Curie won a Nobel Prize in 1911."
    correct = JudgeVerdict(True, "VERDICT: CORRECT")
    # (1 - 0.5) * 1/3 + 0.5 * 1 = 0.667
    reward = verify(MULTI, answer, researched(), PLAIN, judgement=correct)
    assert reward.value == pytest.approx(0.5 / 3 + 0.5)
    assert reward.breakdown["judge_used"] is True and reward.breakdown["judge_score"] == 1.0
    # (1 - 0.5) * 1/3 + 0.5 * 0 = 0.167
    wrong = JudgeVerdict(False, "VERDICT: INCORRECT")
    assert verify(MULTI, answer, researched(), PLAIN, judgement=wrong).value == pytest.approx(
        0.5 / 3
    )


# ----------------------------------------------------------------------------- format tiers


@pytest.mark.parametrize(
    ("score", "well_formed", "value"),
    [
        (1.0, True, 1.0),  # correct, well-formed: the score
        (1.0, False, 0.9),  # correct, malformed: 1 - 0.1
        (0.0, True, 0.1),  # wrong, well-formed: the weight
        (0.0, False, 0.0),  # wrong, malformed: nothing
        (1 / 3, True, 1 / 3),  # max(0.333, 0.1)
        (1 / 3, False, 1 / 3 - 0.1),  # 0.333 - 0.1 = 0.233
        (0.05, False, 0.0),  # max(0, 0.05 - 0.1)
    ],
)
def test_format_tiers(score, well_formed, value):
    assert format_tiers(score, well_formed, FormatConfig(weight=0.1)) == pytest.approx(value)


def test_format_reward_in_verify():
    config = VerifierConfig(anticheat=NO_CHEATS)  # default format weight 0.1
    clean = researched()
    sloppy = record(*clean.steps, step(3, None, error="parse_error", observation="No action"))
    assert verify(QA, "1889", clean, config).value == 1.0
    assert verify(QA, "1889", sloppy, config).value == pytest.approx(0.9)
    assert verify(QA, "1887", clean, config).value == pytest.approx(0.1)
    assert verify(QA, "1887", sloppy, config).value == 0.0
    assert verify(QA, None, clean, config).value == 0.0  # no answer is malformed
    lenient = VerifierConfig(anticheat=NO_CHEATS, format=FormatConfig(max_parse_errors=1))
    assert verify(QA, "1889", sloppy, lenient).value == 1.0


# ----------------------------------------------------------------------------- anti-cheat


def test_restating_the_question_is_flagged_and_zeroed():
    task = {**QA, "question": "What is the capital of France?", "answer": "Paris", "aliases": []}
    # [capital, of, france]: 3 tokens, none absent from the question
    restated = verify(task, "the capital of France", researched())
    assert restated.breakdown["restated_question"] is True
    assert restated.value == 0.0 and restated.breakdown["verdict"] == "zeroed: restated_question"
    # [paris, is, capital, of, france]: "paris" is new, 1/5 = 0.2 > 0.1: not a restatement
    assert (
        verify(task, "Paris is the capital of France", researched()).breakdown["restated_question"]
        is False
    )
    # reported but not zeroed when the detector is not in zero_on
    kept = verify(task, "the capital of France", researched(), VerifierConfig(anticheat=NO_CHEATS))
    assert kept.breakdown["restated_question"] is True and kept.value == pytest.approx(0.1)


def test_stitched_search_snippets_are_flagged():
    snippets = (
        "1. Curie - Marie Curie was awarded the Nobel Prize in Physics in 1903 with Pierre\n"
        "2. Radium - the element radium was discovered by the Curies in Paris in 1898"
    )
    episode = record(step(1, "search", {"query": "curie"}, snippets))
    # normalised: [marie curie was awarded nobel prize in physics element radium was
    # discovered], 12 tokens -> 9 word 4-grams; 5 lie inside snippet 1, 1 inside snippet 2,
    # 3 span the seam: 6/9 = 0.67 >= 0.6
    answer = "Marie Curie was awarded the Nobel Prize in Physics element radium was discovered"
    reward = verify(MULTI, answer, episode)
    assert reward.breakdown["stitched_snippets"] is True and reward.value == 0.0
    # 13 tokens -> 10 4-grams; seen: "nobel prize in physics", "prize in physics in",
    # "in physics in 1903": 3/10 = 0.3 < 0.6
    written = "Marie Curie received the Nobel Prize in Physics in 1903, shared with her husband"
    assert verify(MULTI, written, episode).breakdown["stitched_snippets"] is False


def test_overlong_answers_are_flagged():
    config = VerifierConfig(anticheat=AntiCheatConfig(max_answer_words=5))
    assert verify(QA, "1889 " * 5, researched(), config).breakdown["overlong"] is False
    long = verify(QA, "1889 " * 6, researched(), config)
    assert long.breakdown["overlong"] is True and long.value == 0.0


def test_answering_without_tools_is_flagged_when_the_task_needs_evidence():
    no_tools = record(step(1, None, error="parse_error", observation="No action found"))
    flagged = verify(QA, "1889", no_tools)  # hops 1, no tool step
    assert flagged.breakdown["no_tool_use"] is True and flagged.value == 0.0
    trivia = {**QA, "hops": 0}
    assert verify(trivia, "1889", record()).breakdown["no_tool_use"] is False


# ----------------------------------------------------------------------------- the dispatcher


@pytest.mark.parametrize("task", [QA, CITATION, MULTI, {**QA, "type": "browse_comp"}])
def test_reward_parts_keys_depend_only_on_the_task_type(task):
    """GRPO groups need the same reward part names for every sample of a task."""
    answers = [None, "1889", cite("/wiki/Eiffel_Tower"), "the capital of France " * 200]
    keys = {tuple(verify(task, a, cited_record()).parts()) for a in answers}
    assert len(keys) == 1
    assert all(isinstance(v, float) for v in verify(task, "x", cited_record()).parts().values())


def test_verdicts():
    assert verify(QA, "1889", researched(), PLAIN).breakdown["verdict"] == "correct"
    assert verify(QA, "1887", researched(), PLAIN).breakdown["verdict"] == "incorrect"
    assert verify(MULTI, "Marie Curie", researched(), PLAIN).breakdown["verdict"] == "partial"
    assert verify(QA, "", researched(), PLAIN).breakdown["verdict"] == "no answer"


def test_bad_tasks_raise_task_error():
    with pytest.raises(TaskError, match="unknown type 'essay'"):
        verify({**QA, "type": "essay"}, "x", record())
    with pytest.raises(TaskError, match="no answer"):
        verify({**QA, "answer": "", "aliases": []}, "x", record())


def test_configs_validate_their_fields():
    with pytest.raises(ValueError, match="zero_on"):
        AntiCheatConfig(zero_on=("made_up",))
    with pytest.raises(ValueError, match="weight"):
        FormatConfig(weight=2.0)
