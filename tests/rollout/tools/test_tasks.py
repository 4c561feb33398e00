"""The tool tasks: disjoint splits, determinism, enough test tasks, answers from the data."""

import json

import pytest

from rollout.tasks.generate import split_of
from rollout.tools import generate_tasks
from rollout.tools.calculator import evaluate
from rollout.tools.data import atlas
from rollout.tools.tasks import TEMPLATES, candidates, format_answer, tolerance
from rollout.verifiers.scorers import golds


@pytest.fixture(scope="module")
def test_tasks():
    return generate_tasks("test", 200)


def _countries(task):
    return {s["args"]["country"] for s in task["gold_path"] if s["action"] == "lookup"}


def test_two_hundred_distinct_test_tasks_from_every_template(test_tasks):
    assert len({t["id"] for t in test_tasks}) == 200
    assert len({t["question"] for t in test_tasks}) == 200
    assert {t["template"] for t in test_tasks} == set(TEMPLATES)


def test_generation_is_deterministic_in_the_seed(test_tasks):
    assert generate_tasks("test", 200) == test_tasks
    other = generate_tasks("test", 200, seed=1)
    assert [t["id"] for t in other] != [t["id"] for t in test_tasks]


def test_splits_are_disjoint_by_country():
    data = atlas()
    seen = {}
    for split in ("train", "dev", "test"):
        for tasks in candidates(split).values():
            for t in tasks:
                assert t["id"].startswith(f"{split}-qa-")
                assert seen.setdefault(t["id"], split) == split
                if t["template"] != "tools_largest_in_group":  # split by the group's key
                    isos = {data.find(n).iso for n in _countries(t)}
                    assert {split_of(f"country:{iso}") for iso in isos} == {split}
                else:
                    assert split_of(t["subject"]) == split


def test_tasks_follow_the_harness_schema(test_tasks):
    for t in test_tasks:
        assert t["type"] == "qa" and t["mode"] == "tools" and t["start_url"]
        assert golds(t) == [t["answer"]]
        assert t["hops"] >= 2 and len(t["gold_path"]) >= 2
        json.dumps(t)


def test_each_answer_is_computed_from_the_figures_the_tools_return(test_tasks):
    data = atlas()
    for t in test_tasks:
        values = [
            data.value(data.find(s["args"]["country"]), s["args"]["indicator"]).number
            for s in t["gold_path"]
            if s["action"] == "lookup"
        ]
        if "formula" in t:
            expression = t["formula"].format(*values)
            assert t["gold_path"][-1]["args"]["expression"] == expression
            value = evaluate(expression)
            assert format_answer(value, t["decimals"]) == t["answer"]
            assert 0 < t["tolerance"] <= 0.051  # half a step of an answer >= 10 steps
            step = 10.0 ** -t["decimals"]
            assert t["tolerance"] * abs(float(t["answer"].replace(",", ""))) >= step / 2
        elif t.get("pick") is None:  # the figure looked up last, as it is
            assert t["template"] == "tools_airport_figure"
            assert float(t["answer"].replace(",", "")) == values[-1] >= 1
            assert t["tolerance"] * values[-1] == pytest.approx(0.505, rel=0.01)  # 3 digits
            code = t["gold_path"][0]["args"]["code"]
            airport = data.world.airports[code]
            assert data.find(t["gold_path"][1]["args"]["country"]).iso == airport.country
            assert code in t["question"]
        else:
            names = [s["args"]["country"] for s in t["gold_path"] if s["action"] == "lookup"]
            best = max if t["pick"] == "highest" else min
            assert t["answer"] == names[values.index(best(values))]
            assert sorted(values).count(best(values)) == 1


def test_answer_formatting_and_tolerance():
    assert format_answer(47203.0167, -2) == "47,200"
    assert format_answer(-8.8831, 1) == "-8.9"
    assert format_answer(1.6586, 2) == "1.66"
    assert format_answer(2208.9, 0) == "2,209"
    assert tolerance(47200, -2) == pytest.approx(50 / 47200, rel=0.02)


def test_an_unknown_split_or_too_many_tasks_is_an_error():
    with pytest.raises(ValueError, match="unknown split"):
        generate_tasks("validation", 1)
    with pytest.raises(ValueError, match="tool tasks exist"):
        generate_tasks("test", 10**6)


def test_templates_narrow_the_draw_and_an_unknown_one_is_named():
    chosen = ("tools_per_capita", "tools_ratio")
    tasks = generate_tasks("train", 60, templates=chosen)
    assert {t["template"] for t in tasks} == set(chosen)
    assert all(t["formula"].startswith("round(") for t in tasks)
    with pytest.raises(ValueError, match="tools_nope"):
        generate_tasks("train", 5, templates=("tools_nope",))


def test_the_tools_source_takes_rollout_task_templates():
    from rollout.registry import TaskRequest, task_sources
    from shared.config import from_dict

    cfg = from_dict({"env": {"kind": "tools"}, "rollout": {"task_templates": ["tools_density"]}})
    request = TaskRequest(cfg=cfg, split="dev", n=10, seed=0, web_url="")
    tasks = task_sources.get("tools")(request)
    assert len(tasks) == 10 and {t["template"] for t in tasks} == {"tools_density"}


def test_a_source_asked_for_no_number_gives_every_task_when_fewer_than_its_default():
    """The sidecar asks its source for no number: a narrow task_templates with fewer tasks
    than the default 2000 serves all of them instead of failing at start-up."""
    from rollout.registry import TaskRequest, task_sources
    from rollout.tasks.sources import GENERATED_DEFAULT_N
    from shared.config import from_dict

    cfg = from_dict({"env": {"kind": "tools"}, "rollout": {"task_templates": ["tools_density"]}})
    have = len(candidates("train")["tools_density"])
    assert have < GENERATED_DEFAULT_N
    tasks = task_sources.get("tools")(TaskRequest(cfg=cfg, split="train", seed=0, web_url=""))
    assert len(tasks) == have and len({t["id"] for t in tasks}) == have
    # a number asked for explicitly must still be met
    with pytest.raises(ValueError, match="tool tasks exist"):
        task_sources.get("tools")(TaskRequest(cfg=cfg, split="train", n=have + 1, web_url=""))


def test_the_tasks_cli_lists_and_draws_the_config_s_task_source(tmp_path, capsys):
    """`python -m rollout.tasks --config configs/tiny-tools.toml`: the tool domain's templates
    and tasks, not the web generator's."""
    from rollout.tasks.__main__ import main

    cfg = ["--set", "rollout.task_source=tools"]
    assert main([*cfg, "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(TEMPLATES) and all(ln.startswith("tools_") for ln in lines)
    density = next(ln for ln in lines if ln.startswith("tools_density\t"))
    counts = {s: len(candidates(s)["tools_density"]) for s in ("train", "dev", "test")}
    assert f"train={counts['train']} dev={counts['dev']} test={counts['test']}" in density
    assert density.endswith("gold_steps=3/3")
    assert main([*cfg, "--split", "test", "--n", "4", "--templates", "tools_density"]) == 0
    tasks = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [t["template"] for t in tasks] == ["tools_density"] * 4
    assert tasks == generate_tasks("test", 4, 0, ["tools_density"])
    assert main([*cfg, "--split", "test", "--n", "4", "--templates", "tools_nope"]) == 2
    assert "unknown tool template" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--set", "rollout.task_source=file", "--list"])
