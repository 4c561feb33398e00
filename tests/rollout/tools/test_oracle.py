"""The oracle through the real Environment: 200 test tasks, parsed, run, scored by the verifier."""

import time
from pathlib import Path

from rollout.env.core import Environment, EpisodeLimits
from rollout.net.urls import UrlPolicy
from rollout.tools import generate_tasks, make_backend, make_oracle

N_TASKS = 200


async def run_episode(task, mode):
    env = Environment(mode, make_backend(), UrlPolicy(allowed_hosts=()), limits=EpisodeLimits())
    oracle = make_oracle(task)
    result = await env.reset(task)
    for _ in range(env.limits.max_steps):
        result = await env.step(oracle.next(result.text))
        if result.terminated or result.truncated:
            break
    await env.close()
    return env, result


async def test_the_oracle_solves_at_least_98_percent_of_200_test_tasks(tools_mode):
    tasks = generate_tasks("test", N_TASKS)
    started = time.perf_counter()
    failures, errors = [], 0
    for task in tasks:
        env, result = await run_episode(task, tools_mode)
        errors += sum(1 for s in env.record.steps if s.error)
        if result.reward < 1.0:
            failures.append((task["id"], task["question"], task["answer"], env.record.answer))
    rate = 1 - len(failures) / len(tasks)
    print(
        f"oracle success {rate:.3f} on {len(tasks)} tasks in {time.perf_counter() - started:.1f} s"
    )
    assert rate >= 0.98, failures[:10]
    assert errors == 0  # every gold step parses and runs


async def test_an_episode_records_the_tool_steps_and_the_prompt_lists_the_tools(tools_mode):
    task = next(t for t in generate_tasks("test", 40) if t["template"] == "tools_per_capita")
    env, result = await run_episode(task, tools_mode)
    assert result.terminated and result.info["status"] == "ok"
    assert [s.action for s in env.record.steps] == ["lookup", "lookup", "calculate", "answer"]
    assert env.record.breakdown["verdict"] == "correct"
    prompt = env.system_prompt()
    for name in ("lookup(country: str, indicator: str)", "list_countries", "calculate", "answer"):
        assert name in prompt
    assert "URLs must" not in prompt
    assert "indicators: population (people), " in env.user_prompt()


async def test_a_wrong_or_missing_answer_scores_zero(tools_mode):
    task = next(t for t in generate_tasks("test", 40) if t.get("tolerance"))
    env = Environment(tools_mode, make_backend(), UrlPolicy(allowed_hosts=()))
    await env.reset(task)
    gold = float(task["answer"].replace(",", ""))
    result = await env.step(f'answer("{gold * 1.5:.1f}")')
    assert result.reward == 0.0
    env = Environment(tools_mode, make_backend(), UrlPolicy(allowed_hosts=()))
    await env.reset(task)
    result = await env.step(f'answer("{task["answer"]}")')
    assert result.reward == 0.0  # right number, but no tool used: the anti-cheat zeroes it
    assert result.info["reward_breakdown"]["no_tool_use"] is True


async def test_the_spaced_oracle_writes_the_question_s_tokens_and_still_solves(tools_mode):
    """rollout.oracle_spaced_names: each name the oracle writes is a run of the question's
    tokens under the embedded default's tokenizer, and the answers still verify."""
    from tokenizers import Tokenizer

    from rollout.agent.policies import scripted_oracle
    from shared.config import RolloutConfig

    tasks = [t for t in generate_tasks("test", 60) if t["template"] == "tools_which_of_three"]
    assert tasks
    spaced = RolloutConfig(oracle_spaced_names=True)
    assert type(scripted_oracle("tools", tasks[0], "", spaced)).__name__ == "ToolOracle"
    root = Path(__file__).resolve().parents[3]
    tok = Tokenizer.from_file(str(root / "shared/assets/tiny_tokenizer/tokenizer.json"))
    for task in tasks:
        env = Environment(tools_mode, make_backend(), UrlPolicy(allowed_hosts=()))
        oracle = scripted_oracle("tools", task, "", spaced)
        result = await env.reset(task)
        question = tok.encode(task["question"]).tokens
        while not (result.terminated or result.truncated):
            text = oracle.next(result.text)
            if text.startswith(("lookup", "answer")):
                name = text.split('"')[1]
                assert name.startswith(" ") and name.strip() in task["question"], text
                ids = tok.encode(text).tokens
                span = tok.encode(name).tokens  # the name's tokens, as the call writes them
                assert any(ids[i : i + len(span)] == span for i in range(len(ids)))
                assert any(question[i : i + len(span)] == span for i in range(len(question))), (
                    span,
                    question,
                )
            result = await env.step(text)
        assert result.reward == 1.0, (task["question"], env.record.answer)
        await env.close()
    unspaced = scripted_oracle("tools", tasks[0], "", RolloutConfig())
    assert unspaced.next("")[len('lookup("') :][0] != " "


async def test_the_batched_oracle_reads_one_indicator_s_list_in_one_call(tools_mode):
    """rollout.oracle_batched_lookups: consecutive lookups of one indicator are one call
    naming the countries as the question lists them (a run of the question's tokens);
    every template still solves, in fewer steps where its lookups share an indicator."""
    from tokenizers import Tokenizer

    from rollout.agent.policies import scripted_oracle
    from shared.config import RolloutConfig

    root = Path(__file__).resolve().parents[3]
    tok = Tokenizer.from_file(str(root / "shared/assets/tiny_tokenizer/tokenizer.json"))
    both = RolloutConfig(oracle_spaced_names=True, oracle_batched_lookups=True)
    tasks = generate_tasks("test", N_TASKS)
    failures, shorter, copied = [], 0, 0
    for task in tasks:
        env = Environment(tools_mode, make_backend(), UrlPolicy(allowed_hosts=()))
        oracle = scripted_oracle("tools", task, "", both)
        result = await env.reset(task)
        while not (result.terminated or result.truncated):
            result = await env.step(oracle.next(result.text))
        await env.close()
        steps = env.record.steps
        assert not any(s.error for s in steps), [s.raw for s in steps]
        if result.reward < 1.0:
            failures.append((task["question"], env.record.answer))
        lookups = [s for s in task["gold_path"] if s["action"] == "lookup"]
        indicators = {s["args"]["indicator"] for s in lookups}
        calls = [s for s in steps if s.action == "lookup"]
        if len(indicators) == 1 and len(lookups) > 1:  # one call reads them all
            assert len(calls) == 1, [s.raw for s in steps]
            shorter += 1
            listed = calls[0].raw.split('"')[1]
            assert listed.startswith(" ")
            if task["template"] == "tools_which_of_three":
                assert listed.strip() in task["question"]  # "Which of A, B and C ..."
            if listed.strip() in task["question"]:  # the question's own span, its tokens
                span, question = tok.encode(listed).tokens, tok.encode(task["question"]).tokens
                assert any(question[i : i + len(span)] == span for i in range(len(question)))
                copied += 1
        else:
            assert len(calls) == len(lookups)
        if task["template"] == "tools_which_of_three":
            assert [s.action for s in steps] == ["lookup", "answer"]
    assert len(failures) <= 0.02 * len(tasks), failures[:10]
    assert shorter >= 20 and copied >= 20  # which of three, combined population, ...


async def test_the_airport_template_walks_two_hops_and_copies_the_figure(tools_mode):
    """airport(code) names the country, lookup reads its count, the answer is that count
    (with spaced names: the code as the question writes it, the country as the airport's
    observation does, a run of its tokens)."""
    from rollout.agent.policies import scripted_oracle
    from shared.config import RolloutConfig

    tasks = generate_tasks("test", 30, templates=["tools_airport_figure"])
    spaced = RolloutConfig(oracle_spaced_names=True)
    for task in tasks:
        env = Environment(tools_mode, make_backend(), UrlPolicy(allowed_hosts=()))
        oracle = scripted_oracle("tools", task, "", spaced)
        result = await env.reset(task)
        texts = []
        while not (result.terminated or result.truncated):
            texts.append(oracle.next(result.text))
            result = await env.step(texts[-1])
        await env.close()
        code, country = task["gold_path"][0]["args"]["code"], task["evidence"][0]["quote"]
        assert texts == [
            f'airport(" {code}")',
            f'lookup("{country}", "{task["gold_path"][1]["args"]["indicator"]}")',
            f'answer(" {task["answer"].replace(",", "")}")',
        ]
        assert f" {code}?" in task["question"]  # the code follows a space in the question
        assert f'lookup("{country}", indicator)' in env.record.steps[0].observation
        assert result.reward == 1.0 and env.record.breakdown["verdict"] == "correct"


async def test_the_noisy_tool_oracle_has_the_habits_it_is_asked_for(tools_mode):
    """rollout.policy = "noisy_oracle" in the tools kind: a wrong indicator per lookup with
    probability oracle_noise, one hop short (the airport's country as the answer) with
    probability oracle_premature; the same seed gives the same episode."""
    from rollout.agent.policies import scripted_oracle
    from shared.config import RolloutConfig

    cfg = RolloutConfig(oracle_noise=0.35, oracle_premature=0.2)
    tasks = generate_tasks("train", 200, templates=["tools_airport_figure"])

    async def run(task, seed, rollout=cfg):
        env = Environment(tools_mode, make_backend(), UrlPolicy(allowed_hosts=()))
        oracle = scripted_oracle("tools", task, "", rollout, noisy=True, seed=seed)
        result = await env.reset(task)
        while not (result.terminated or result.truncated):
            result = await env.step(oracle.next(result.text))
        await env.close()
        return result.reward, [(s.action, dict(s.args)) for s in env.record.steps]

    episodes = [await run(t, seed) for seed, t in enumerate(tasks)]
    short = wrong = right = 0
    for task, (reward, steps) in zip(tasks, episodes, strict=True):
        gold = task["gold_path"][1]["args"]["indicator"]
        if [a for a, _ in steps] == ["airport", "answer"]:
            short += 1
            assert steps[1][1]["text"] == task["evidence"][0]["quote"]  # the country
            assert reward < 1.0
        elif steps[1][1]["indicator"] != gold:
            wrong += 1
            assert reward < 1.0  # it answers the figure it read
        else:
            right += 1
            assert reward == 1.0
    n = len(tasks)
    assert 0.1 * n <= short <= 0.3 * n  # 0.2
    assert 0.2 <= wrong / (n - short) <= 0.5  # 0.35
    assert right + short + wrong == n
    assert await run(tasks[0], 0) == episodes[0]  # seeded
    # no noise, no habits: the exact oracle's episodes
    exact = RolloutConfig(oracle_noise=0.0, oracle_premature=0.0)
    assert [(await run(t, s, exact))[0] for s, t in enumerate(tasks[:20])] == [1.0] * 20
    assert type(scripted_oracle("tools", tasks[0], "", cfg)).__name__ == "ToolOracle"
