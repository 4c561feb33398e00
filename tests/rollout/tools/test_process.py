"""The evidence process reward on the tool domain: a task's evidence is the figures its
gold path reads, and a lookup reaches the figures it showed (``EnvKind.reached``)."""

import pytest

from rollout.env.core import Environment, EpisodeLimits
from rollout.net.urls import UrlPolicy
from rollout.registry import envs
from rollout.tools import generate_tasks, make_backend, make_oracle
from rollout.tools.backend import airport_url, figure_url, figures_read
from rollout.tools.data import atlas
from rollout.tools.tasks import TEMPLATES
from rollout.tracking.records import EpisodeRecord, Step
from rollout.verifiers import ProcessConfig, VerifierConfig
from rollout.verifiers.process import evidence_reached


def lookup(country, indicator, index=1, error=None) -> Step:
    return Step(index, "", "lookup", {"country": country, "indicator": indicator}, error=error)


def which_of_three() -> dict:
    return next(t for t in generate_tasks("test", 40) if t["template"] == "tools_which_of_three")


async def test_every_task_names_the_figures_its_gold_path_reads_as_evidence():
    backend, data = make_backend(), atlas()
    tasks = generate_tasks("test", 10 * len(TEMPLATES))
    assert {t["template"] for t in tasks} == set(TEMPLATES)
    for task in tasks:
        lookups = [s["args"] for s in task["gold_path"] if s["action"] == "lookup"]
        airports = [s["args"]["code"] for s in task["gold_path"] if s["action"] == "airport"]
        figures = task["evidence"][len(airports) :]
        assert [e["url"] for e in task["evidence"]] == [airport_url(c) for c in airports] + [
            figure_url(data.find(a["country"]).iso, a["indicator"]) for a in lookups
        ]
        for item, code in zip(task["evidence"], airports, strict=False):
            assert f", in {item['quote']}; lookup(" in backend.airport(code).text
            assert backend.countries_named(item["quote"])  # a name lookup takes
        for item, args in zip(figures, lookups, strict=True):
            shown = backend.lookup(args["country"], args["indicator"]).text
            assert f" = {item['quote']} " in shown  # the figure as the lookup shows it


def test_a_lookup_reaches_the_figures_it_showed_and_nothing_else():
    data = atlas()
    no, se = data.find("Norway").iso, data.find("Sweden").iso
    assert figures_read(lookup("norway", "Labor Force")) == [figure_url(no, "labor_force")]
    assert figures_read(lookup(" Norway, Sweden and Gabon", "population"))[:2] == [
        figure_url(no, "population"),
        figure_url(se, "population"),
    ]
    assert len(figures_read(lookup(" Norway, Sweden and Gabon", "population"))) == 3
    # a figure the source lacks is not reached, the others of the list are
    assert figures_read(lookup("Western Sahara, Norway", "gdp_official")) == [
        figure_url(no, "gdp_official")
    ]
    for step in (
        lookup("Norway", "population", error="tool_error"),
        lookup("Narnia", "population"),
        lookup("Norway", "happiness"),
        Step(1, "", "calculate", {"expression": "1 + 1"}),
        Step(1, "", "lookup", {"country": 3, "indicator": "population"}),
    ):
        assert figures_read(step) == []
    assert envs.get("tools").reached is not None


def test_evidence_counts_the_figures_read_before_the_answer():
    task = which_of_three()
    (a, ind), (b, _), (c, _) = [
        (s["args"]["country"], s["args"]["indicator"]) for s in task["gold_path"]
    ]
    record = EpisodeRecord("e", task, "tools")
    record.steps = [
        lookup(a, ind, 1),
        lookup(a, ind, 2),  # the same figure twice counts once
        lookup(b, "area_km2" if ind != "area_km2" else "population", 3),  # another figure
        lookup(c, ind, 4, error="tool_error"),
        Step(5, "", "answer", {"text": a}),
        lookup(b, ind, 6),  # after the answer
    ]
    value, parts = evidence_reached(task, record)
    assert value == pytest.approx(1 / 3)
    assert (parts["evidence_pages"], parts["evidence_reached"]) == (3.0, 1.0)
    record.steps = [lookup(f"{a}, {b} and {c}", ind, 1)]  # one list lookup reads all three
    assert evidence_reached(task, record)[0] == 1.0
    record.mode = "api"  # a browser episode's lookups are nothing it reached
    assert evidence_reached(task, record)[0] == 0.0


async def test_the_environment_adds_the_tool_evidence_term():
    verifier = VerifierConfig(process=ProcessConfig("evidence", weight=0.3, cap=0.5))
    task = which_of_three()
    (a, ind), (b, _) = [(s["args"]["country"], s["args"]["indicator"]) for s in task["gold_path"]][
        :2
    ]
    wrong = next(
        s["args"]["country"] for s in task["gold_path"] if s["args"]["country"] != task["answer"]
    )

    env = Environment("tools", make_backend(), UrlPolicy(allowed_hosts=()), verifier=verifier)
    await env.reset(task)
    for text in (f'lookup("{a}", "{ind}")', f'lookup("{b}", "{ind}")', f'answer("{wrong}")'):
        result = await env.step(text)
    await env.close()
    b_ = env.record.breakdown
    assert result.terminated and b_["verdict"] != "correct"
    assert (b_["evidence_pages"], b_["evidence_reached"]) == (3.0, 2.0)
    # outcome 0.1 (well-formed, wrong); term min(0.3 * 2/3, 0.5 * 0.9) = 0.2
    assert b_["process_term"] == pytest.approx(0.2)
    assert env.record.reward == pytest.approx(b_["outcome"] + 0.2)

    env = Environment(
        "tools", make_backend(), UrlPolicy(allowed_hosts=()), limits=EpisodeLimits(),
        verifier=verifier,
    )  # fmt: skip
    oracle = make_oracle(task)
    result = await env.reset(task)
    while not (result.terminated or result.truncated):
        result = await env.step(oracle.next(result.text))
    await env.close()
    b_ = env.record.breakdown
    assert b_["verdict"] == "correct" and b_["process"] == 1.0
    assert env.record.reward == pytest.approx(1.0 + 0.3)
