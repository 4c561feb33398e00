"""The scripted policies' decisions, observation by observation (no web needed)."""

import pytest

from rollout.agent.policies import NoisyOraclePolicy, OraclePolicy

TASK = {
    "type": "qa",
    "question": "Which time zone is Butare, Rwanda in?",
    "answer": "Africa/Kigali",
    "gold_path": [
        {"action": "search", "args": {"query": "Butare Rwanda city"}},
        {"action": "visit", "args": {"url": "http://w/geo/city/1"}},
    ],
    "evidence": [
        {"url": "http://w/geo/city/1", "quote": "Butare is in the Africa/Kigali time zone."}
    ],
}
RESULTS = (
    'Search results for "Butare Rwanda city":\n1. Butare, Rwanda - city\n   http://w/geo/city/1\n'
    "   Butare is in the Africa/Kigali time zone.\n2. Kigali, Rwanda - city\n   http://w/geo/city/2\n"
    "   Kigali is in the Africa/Kigali time zone. Kigali is the capital of Rwanda."
)
PAGE = "URL: http://w/geo/city/1\n# Butare\nButare is in the Africa/Kigali time zone."


def test_oracle_walks_the_whole_gold_path_by_default():
    p = OraclePolicy(TASK, "api", "http://w")
    assert p.next("start") == "<search> Butare Rwanda city</search>"
    assert p.next(RESULTS) == "<visit> http://w/geo/city/1</visit>"
    assert p.next(PAGE) == "<answer> Africa/Kigali</answer>"


def test_shortcut_answers_once_the_evidence_is_in_view_and_not_before():
    p = OraclePolicy(TASK, "api", "http://w", shortcut=True)
    assert p.next("start") == "<search> Butare Rwanda city</search>"
    assert p.next(RESULTS) == "<answer> Africa/Kigali</answer>" and p.answering
    q = OraclePolicy(TASK, "api", "http://w", shortcut=True)
    q.next("start")
    snippet_without_evidence = RESULTS.replace("Butare is in the", "Butare lies in the")
    assert q.next(snippet_without_evidence) == "<visit> http://w/geo/city/1</visit>"
    assert not q.answering
    assert q.next(PAGE) == "<answer> Africa/Kigali</answer>"


def test_noisy_shortcut_oracle_still_makes_mistakes():
    # p=1: every decision is a mistake: it opens the other result, then answers with
    # another name it read; the shortcut does not bypass the noise.
    p = NoisyOraclePolicy(TASK, "api", "http://w", p=1.0, seed=0, shortcut=True)
    p.next("start")
    assert p.next(RESULTS) == "<visit> http://w/geo/city/2</visit>"
    text = p.next(PAGE.replace("/1", "/2").replace("Butare", "Kigali"))
    assert text.startswith("<answer>") and "Africa/Kigali" not in text
    clean = NoisyOraclePolicy(TASK, "api", "http://w", p=0.0, seed=0, shortcut=True)
    clean.next("start")
    assert clean.next(RESULTS) == "<answer> Africa/Kigali</answer>"


def test_question_query_searches_with_the_question_as_asked():
    p = OraclePolicy(TASK, "api", "http://w", query="question")
    assert p.next("start") == "<search> Which time zone is Butare, Rwanda in?</search>"
    som = OraclePolicy(TASK, "som", "http://w", query="question")
    assert (
        som.next("start") == 'goto("http://w/search?q=Which+time+zone+is+Butare%2C+Rwanda+in%3F")'
    )
    with pytest.raises(ValueError, match="gold' or 'question"):
        OraclePolicy(TASK, "api", "http://w", query="keywords")


def test_article_answers_with_the_evidence_article_and_the_verifier_agrees():
    from rollout.agent.policies import _with_article
    from rollout.verifiers.text import exact_match

    p = OraclePolicy(TASK, "api", "http://w", shortcut=True, article=True)
    p.next("start")
    assert p.next(RESULTS) == "<answer> the Africa/Kigali</answer>"
    assert exact_match("the Africa/Kigali", TASK["answer"]) == 1.0
    # No article before the answer in the evidence: the answer as it is.
    bare = {**TASK, "evidence": [{**TASK["evidence"][0], "quote": "Butare: Africa/Kigali"}]}
    q = OraclePolicy(bare, "api", "http://w", shortcut=True, article=True)
    q.next("start")
    assert q.next(RESULTS.replace("Butare is in the ", "Butare: ")) == (
        "<answer> Africa/Kigali</answer>"
    )
    # A word that merely ends in an article's letters is not one ("Lathe Africa/Kigali").
    assert _with_article("Africa/Kigali", ["Lathe Africa/Kigali."]) == "Africa/Kigali"
    assert _with_article("Africa/Kigali", ["in a Africa/Kigali zone"]) == "a Africa/Kigali"


def test_rollout_seed_changes_the_task_order_and_each_pass_is_a_permutation():
    from itertools import islice

    from rollout.sidecar.engine import cycle_tasks

    tasks = [{"id": i} for i in range(20)]
    a = [t["id"] for t in islice(cycle_tasks(tasks, 0), 40)]
    b = [t["id"] for t in islice(cycle_tasks(tasks, 1), 40)]
    assert a != b and a == [t["id"] for t in islice(cycle_tasks(tasks, 0), 40)]
    assert sorted(a[:20]) == sorted(a[20:]) == list(range(20))


def test_som_question_search_types_into_the_page_form_then_presses_its_button():
    start = (
        'URL: http://w/\nTitle: Seek - Seek\n\n[1] link "Seek"\n'
        '[8] searchbox "Search query" value="" [9] button "Search"\n'
    )
    p = OraclePolicy(TASK, "som", "http://w", shortcut=True, query="question", article=True)
    assert p.next(start) == 'type(8, "Which time zone is Butare, Rwanda in?")'
    assert p.next(start.replace('value=""', 'value="Which time zone is Butare, Rwanda in?"')) == (
        "click(9)"
    )
    assert p.next(RESULTS) == 'answer("the Africa/Kigali")'
    # The noisy oracle presses the button too before any mistake of its own.
    n = NoisyOraclePolicy(TASK, "som", "http://w", p=1.0, seed=0, query="question")
    assert n.next(start).startswith("type(8, ") and n.next(start) == "click(9)"
    # Non-ASCII text is written as it reads, not as \\u escapes: the policy copies it.
    q = {**TASK, "question": "Which time zone is Lālsot, India in?"}
    assert "Lālsot" in OraclePolicy(q, "som", "http://w", query="question").next(start)


def test_noisy_oracle_never_opens_the_page_it_is_reading_as_a_wrong_result():
    # In som mode a view starts with its own URL; re-opening it would only reload the
    # results (and fill the context with the same view twice).
    here = "URL: http://w/search?q=Butare\n\n" + RESULTS
    for seed in range(20):
        p = NoisyOraclePolicy(TASK, "som", "http://w", p=1.0, seed=seed)
        p.next("start")
        assert p.next(here) == 'goto("http://w/geo/city/2")'


# ---------------------------------------------------------------------- long-horizon gold paths

LONG = {
    "type": "qa",
    "question": "How many cities of Ruritania have a population of less than 20,000?",
    "answer": "1",
    "derived": True,
    "gold_path": [
        {"action": "search", "args": {"query": "Ruritania country profile"}},
        {"action": "visit", "args": {"url": "http://w/geo/country/RU/cities?page=1"}},
        {"action": "next_page", "args": {"url": "http://w/geo/country/RU/cities?page=2"}},
        {"action": "visit", "args": {"url": "http://w/airports/AAA", "data": "http://w/a.json"}},
    ],
    "evidence": [
        {"url": "http://w/geo/country/RU/cities?page=1", "quote": "largest first."},
        {"url": "http://w/airports/AAA", "quote": "1,234 ft"},
    ],
}
LIST_PAGE = "URL: http://w/geo/country/RU/cities?page=1\nCities, largest first.\n"


def test_next_page_is_a_visit_in_api_mode_and_a_click_in_the_browser_modes():
    api = OraclePolicy(LONG, "api", "http://w")
    api.next("start"), api.next("results"), api.next(LIST_PAGE)
    assert api.plan[0]["action"] == "visit"  # next_page was taken
    pw = OraclePolicy(LONG, "playwright", "http://w")
    pw.next("start"), pw.next("results")
    assert pw.next(LIST_PAGE) == 'click("a[rel=\\"next\\"]")'
    som = OraclePolicy(LONG, "som", "http://w")
    som.next("start"), som.next("results")
    cut = LIST_PAGE + '[3] link "Aa"\n[... more below: scroll down to read on]'
    assert som.next(cut) == 'scroll("down")'  # the link is not in view yet: read on
    assert som.next('[4] link "Zz"\nPage 1 of 2 [5] link "Next page"') == "click(5)"


def test_panels_are_read_from_their_source_in_api_mode_and_derived_answers_need_the_evidence():
    api = OraclePolicy(LONG, "api", "http://w")
    for view in ("start", "results", LIST_PAGE):
        api.next(view)
    assert (
        api.next("URL: http://w/geo/country/RU/cities?page=2") == "<visit> http://w/a.json</visit>"
    )
    assert api.next('{"Elevation": "1,234 ft"}') == "<answer> 1</answer>"  # a count: not quoted
    som = OraclePolicy(LONG, "som", "http://w")
    for view in ("start", "results", LIST_PAGE, '[9] link "Next page"'):
        som.next(view)
    assert som.next("URL: http://w/geo/country/RU/cities?page=2") == 'goto("http://w/airports/AAA")'
    blind = OraclePolicy(LONG, "api", "http://w")
    for view in ("start", "results", LIST_PAGE, "page 2"):
        blind.next(view)
    assert blind.next("Loading details...") == "<answer> unknown</answer>"  # no evidence: no answer


TWO_HOP = {
    "type": "qa",
    "question": "What is the capital of the country where the airport with IATA code JMK is located?",
    "answer": "Athens",
    "gold_path": [
        {"action": "search", "args": {"query": "JMK airport"}},
        {"action": "visit", "args": {"url": "http://w/airports/JMK"}},
        {"action": "visit", "args": {"url": "http://w/geo/country/GR"}},
    ],
    "evidence": [
        {"url": "http://w/airports/JMK", "quote": "is an airport serving Mykonos Island, Greece."},
        {"url": "http://w/geo/country/GR", "quote": "The capital of Greece is Athens."},
    ],
}
HOP_RESULTS = (
    'Search results for "JMK airport":\n1. Mikonos Airport (JMK) - airport\n'
    "   http://w/airports/JMK\n   Mikonos Airport is an airport serving Mykonos Island, Greece.\n"
    "2. Capital City Airport (FFT) - airport\n   http://w/airports/FFT\n"
    "   Capital City Airport is an airport serving Frankfort, United States."
)
HOP_AIRPORT = (
    "URL: http://w/airports/JMK\n# Mikonos Airport (JMK)\n"
    "Mikonos Airport is an airport serving Mykonos Island, Greece.\n"
    "- Country: [Greece](/geo/country/GR)"
)
HOP_COUNTRY = "URL: http://w/geo/country/GR\n# Greece\nThe capital of Greece is Athens."


def _episode(policy, views):
    out = []
    for view in views:
        out.append(policy.next(view))
        if policy.answering:
            break
    return out


def test_premature_oracle_answers_with_the_bridge_once_the_first_evidence_is_in_view():
    views = ["start", HOP_RESULTS, HOP_AIRPORT, HOP_COUNTRY]
    p = NoisyOraclePolicy(TWO_HOP, "api", "http://w", p=0.0, seed=0, premature=1.0)
    assert _episode(p, views) == ["<search> JMK airport</search>", "<answer> Greece</answer>"]
    # not premature: the whole path, and the right answer
    q = NoisyOraclePolicy(TWO_HOP, "api", "http://w", p=0.0, seed=0, premature=0.0)
    assert (
        _episode(q, views)[-1] == "<answer> Athens</answer>"
        and len(_episode(NoisyOraclePolicy(TWO_HOP, "api", "http://w", p=0.0, seed=0), views)) == 4
    )
    # one hop: no bridge, so premature changes nothing
    one = NoisyOraclePolicy(TASK, "api", "http://w", p=0.0, seed=0, premature=1.0)
    assert _episode(one, ["start", RESULTS.replace("Butare is", "Butare lies"), PAGE]) == [
        "<search> Butare Rwanda city</search>", "<visit> http://w/geo/city/1</visit>",
        "<answer> Africa/Kigali</answer>",
    ]  # fmt: skip


def test_premature_is_drawn_once_per_episode_at_its_rate_and_leaves_the_other_draws_alone():
    views = ["start", HOP_RESULTS, HOP_AIRPORT, HOP_COUNTRY]
    short = 0
    for seed in range(400):
        p = NoisyOraclePolicy(TWO_HOP, "api", "http://w", p=0.35, seed=seed, premature=0.6)
        texts = _episode(p, views)
        if texts[-1] == "<answer> Greece</answer>" and len(texts) == 2:
            short += 1
        else:  # the episode is the one the same seed gives without premature
            q = NoisyOraclePolicy(TWO_HOP, "api", "http://w", p=0.35, seed=seed)
            assert texts == _episode(q, views)
    assert 0.53 < short / 400 < 0.67  # 0.6, within ~3 standard deviations


# A walk (rollout.tasks.long_horizon.walk_city_airport), three hops down a city list
WALK = {
    "type": "qa",
    "question": "Going down the Atlas's list of the cities of France, largest first, which is "
    "the first city after Torcy whose Atlas page lists an airport?",
    "answer": "Pontoise",
    "bridge": "Brétigny-sur-Orge",
    "gold_path": [
        {"action": "search", "args": {"query": "Torcy France city"}},
        {"action": "visit", "args": {"url": "http://w/geo/city/1"}},
        {"action": "next_page", "args": {"url": "http://w/geo/city/2"}},
        {"action": "next_page", "args": {"url": "http://w/geo/city/3"}},
        {"action": "next_page", "args": {"url": "http://w/geo/city/4"}},
    ],
    "evidence": [
        {"url": "http://w/geo/city/1", "quote": "Next: Brétigny-sur-Orge"},
        {"url": "http://w/geo/city/4", "quote": "Pontoise Airport (POX)"},
    ],
}


def _city(n: int, name: str, nxt: str, airport: str = "") -> str:
    return (
        f"URL: http://w/geo/city/{n}\n# {name}\n{name} is a city in France.\n{airport}"
        f"[Previous: X](http://w/geo/city/{n - 1}) | [Next: {nxt}](http://w/geo/city/{n + 1})"
    )


WALK_VIEWS = [
    "start",
    "1. Torcy, France - city\n   http://w/geo/city/1\n   Torcy is a city in France.",
    _city(1, "Torcy", "Brétigny-sur-Orge"),
    _city(2, "Brétigny-sur-Orge", "Miramas"),
    _city(3, "Miramas", "Pontoise"),
    _city(
        4, "Pontoise", "Agde", "## Airports\n- [Pontoise Airport (POX)](http://w/airports/POX)\n"
    ),
]


def test_a_walk_follows_each_next_link_and_one_hop_short_answers_the_city_after_the_start():
    """The oracle follows "Next" page by page and answers at the page listing an airport;
    the premature habit answers with the task's bridge (the city X's page names as "Next")
    as soon as X's page is in view; the browser modes click the "Next: ..." link."""
    whole = _episode(OraclePolicy(WALK, "api", "http://w"), WALK_VIEWS)
    assert whole == [
        "<search> Torcy France city</search>", "<visit> http://w/geo/city/1</visit>",
        "<visit> http://w/geo/city/2</visit>", "<visit> http://w/geo/city/3</visit>",
        "<visit> http://w/geo/city/4</visit>", "<answer> Pontoise</answer>",
    ]  # fmt: skip
    short = NoisyOraclePolicy(WALK, "api", "http://w", p=0.0, seed=0, premature=1.0)
    assert _episode(short, WALK_VIEWS)[2:] == ["<answer> Brétigny-sur-Orge</answer>"]
    som = OraclePolicy(WALK, "som", "http://w")
    som.plan = som.plan[2:]  # at Torcy's page: the next step follows its "Next" link
    view = 'URL: http://w/geo/city/1\n[7] link "Previous: X"\n[8] link "Next: Brétigny-sur-Orge"'
    assert som.next(view) == "click(8)"


def vero_beach_walk(*urls: str) -> dict:
    """A walk task visiting ``urls`` whose last page lists Vero Beach's airport."""
    return {
        "type": "qa",
        "question": "Which is the first city after Hough whose Atlas page lists an airport?",
        "answer": "Vero Beach",
        "gold_path": [{"action": "visit", "args": {"url": u}} for u in urls],
        "evidence": [{"url": urls[-1], "quote": "Vero Beach Regional Airport"}],
    }


def test_heading_answers_a_name_as_the_heading_in_view_writes_it():
    from rollout.agent.policies import _as_heading
    from rollout.verifiers.text import exact_match

    walk = vero_beach_walk("http://w/geo/city/2")
    page = (
        "URL: http://w/geo/city/2\nTitle: Vero Beach - Atlas\n\n# Vero Beach\n\n"
        "Vero Beach is a city in United States.\n\n## Airports\n\n- Vero Beach Regional Airport"
    )
    p = OraclePolicy(walk, "api", "http://w", heading=True)
    assert p.next("start") == "<visit> http://w/geo/city/2</visit>"
    assert p.next(page) == "<answer> # Vero Beach</answer>"
    assert exact_match("# Vero Beach", walk["answer"]) == 1.0
    # Off, or a page whose heading is not the answer alone: the answer as it is.
    q = OraclePolicy(walk, "api", "http://w")
    q.next("start")
    assert q.next(page) == "<answer> Vero Beach</answer>"
    assert _as_heading("Vero Beach", page.replace("# Vero Beach\n", "# Vero Beach, FL\n")) == (
        "Vero Beach"
    )
    assert _as_heading("Vero Beach", "## Vero Beach") == "## Vero Beach"
    assert _as_heading("Vero Beach", "Title: Vero Beach - Atlas") == "Vero Beach"
    # The noisy oracle writes its right answers the same way.
    n = NoisyOraclePolicy(walk, "api", "http://w", p=0.0, seed=0, heading=True)
    n.next("start")
    assert n.next(page) == "<answer> # Vero Beach</answer>"


def test_giving_up_answers_unknown_first_in_its_share_of_episodes_and_changes_nothing_else():
    walk = vero_beach_walk("http://w/geo/city/1", "http://w/geo/city/2")
    page = "URL: http://w/geo/city/2\n\n# Vero Beach\n\n- Vero Beach Regional Airport"

    def first_actions(seed: int, give_up: float) -> list[str]:
        p = NoisyOraclePolicy(walk, "api", "http://w", p=0.3, seed=seed, give_up=give_up)
        out = [p.next("start")]
        if "<answer>" not in out[0]:
            out += [p.next("http://w/geo/city/1"), p.next(page)]
        return out

    runs = {s: first_actions(s, 0.6) for s in range(400)}
    quit = [s for s, acts in runs.items() if acts == ["<answer> unknown</answer>"]]
    assert 0.52 < len(quit) / 400 < 0.68  # a binomial(400, 0.6) is within 0.08 at 4 sigma
    # the episodes that do not give up are those of the habit turned off, draw for draw
    for s, acts in runs.items():
        if s not in quit:
            assert acts == first_actions(s, 0.0)
    assert first_actions(quit[0], 1.0) == ["<answer> unknown</answer>"]
    assert all("unknown" not in first_actions(s, 0.0)[0] for s in range(50))


def test_the_tools_kind_refuses_giving_up():
    from rollout.tools import _oracle
    from shared.config import RolloutConfig

    task = {"type": "tools", "question": "q", "answer": "a", "gold_path": []}
    with pytest.raises(ValueError, match="oracle_give_up"):
        _oracle(task, rollout=RolloutConfig(oracle_give_up=0.5), noisy=True)
