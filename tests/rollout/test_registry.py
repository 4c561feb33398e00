"""The registries of environments, task sources and verifiers (``rollout.registry``)."""

import contextlib
import importlib
import json
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from rollout import eval as rollout_eval
from rollout.agent.actions import ACTIONS, Action, ActionSpec, Answer, Param, describe_actions
from rollout.agent.parser import ParseError, parse
from rollout.agent.policies import scripted_oracle
from rollout.env import browsers_for, make_env, page_reward
from rollout.env.observation import Observation
from rollout.registry import (
    ENV_GROUP,
    EnvKind,
    Registry,
    RegistryError,
    TaskRequest,
    UnknownName,
    envs,
    task_sources,
    verifiers,
)
from rollout.tracking.records import EpisodeRecord
from rollout.verifiers import verify
from shared import config as cfg

REPO = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------- the registry


def test_register_get_and_names():
    reg = Registry("widget", "drh.test.none")
    assert reg.register("a", 1) == 1
    reg.register("b", 2)
    assert reg.get("a") == 1 and reg["b"] == 2
    assert reg.names() == ("a", "b") and "a" in reg and "c" not in reg
    assert list(reg) == ["a", "b"] and len(reg) == 2


def test_a_duplicate_is_an_error_unless_replaced():
    reg = Registry("widget", "drh.test.none")
    reg.register("a", 1)
    with pytest.raises(RegistryError, match="'a' is registered already; pass replace=True"):
        reg.register("a", 2)
    reg.register("a", 3, replace=True)
    assert reg.get("a") == 3


def test_an_unknown_name_lists_the_known_ones_and_the_group():
    reg = Registry("widget", "drh.test.none", key="section.widget")
    reg.register("a", 1)
    reg.register("b", 2)
    with pytest.raises(UnknownName) as e:
        reg.get("zz")
    message = str(e.value)
    assert "unknown widget 'zz' (section.widget); registered: a, b" in message
    assert "entry-point group drh.test.none" in message
    assert isinstance(e.value, ValueError) and isinstance(e.value, KeyError)


@pytest.mark.parametrize("name", ["", "1abc", "two words", "a/b", None])
def test_names_have_one_form(name):
    with pytest.raises(RegistryError, match="expected letters, digits"):
        Registry("widget", "drh.test.none").register(name, 1)


def test_the_check_refuses_a_malformed_entry():
    reg = Registry("verifier", "drh.test.none", check=verifiers._check)
    with pytest.raises(RegistryError, match="'x' is a int; expected a callable"):
        reg.register("x", 3)


def test_builtins_are_imported_on_the_first_lookup(tmp_path, monkeypatch):
    reg = Registry("widget", "drh.test.none", builtins="drh_test_builtins")
    monkeypatch.setitem(sys.modules, "drh_test_holder", types.SimpleNamespace(REG=reg))
    (tmp_path / "drh_test_builtins.py").write_text(
        "import drh_test_holder\n\ndrh_test_holder.REG.register('inner', 'here')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        reg.register("outer", "too")  # the in-tree ones are registered first: a clash shows
        assert reg.names() == ("inner", "outer")
        with pytest.raises(RegistryError, match="registered already"):
            reg.register("inner", "again")
    finally:
        sys.modules.pop("drh_test_builtins", None)


def test_builtins_register_in_their_order_whatever_is_imported_first(tmp_path, monkeypatch):
    reg = Registry(
        "widget", "drh.test.none", builtins=("drh_test_first:register", "drh_test_second:register")
    )
    monkeypatch.setitem(sys.modules, "drh_test_holder", types.SimpleNamespace(REG=reg))
    for name in ("first", "second"):
        (tmp_path / f"drh_test_{name}.py").write_text(
            f"import drh_test_holder\n\n\ndef register():\n"
            f"    drh_test_holder.REG.register({name!r}, {name!r})\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("drh_test_second")  # importing registers nothing
        assert reg._entries == {}
        assert reg.names() == ("first", "second")  # the first lookup calls both, in order
    finally:
        for name in ("drh_test_first", "drh_test_second"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize("first", ["rollout.env", "rollout.tools", "rollout.tasks.sources"])
def test_the_in_tree_names_come_in_one_order_whatever_is_imported_first(first):
    code = (
        f"import json, {first}\n"
        "from rollout.registry import envs, task_sources, verifiers\n"
        "print(json.dumps([envs.names()[:4], task_sources.names()[:3], verifiers.names()[:4]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [
        ["api", "playwright", "som", "tools"],
        ["generated", "file", "tools"],
        ["qa", "browse_comp", "citation", "multi_doc"],
    ]


# ----------------------------------------------------------------------------- entry points


def _distribution(root, dist: str, module: str, source: str, entries: dict[str, dict[str, str]]):
    """A minimal installed distribution under ``root``: its module and its dist-info."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = []
    for group, eps in entries.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("drh_fake_plugin", "drh_broken_plugin", "drh_other_plugin"):
        sys.modules.pop(name, None)


def test_entry_points_are_listed_then_loaded_by_name(site):
    group = "drh.test.verifiers"
    _distribution(
        site, "fake-plugin", "drh_fake_plugin",
        """
        def score(task, body, cited, record, config, judgement):
            return 1.0, {}
        """,
        {group: {"fake": "drh_fake_plugin:score"}},
    )  # fmt: skip
    reg = Registry("task type", group, check=verifiers._check)
    reg.register("builtin", lambda *a: (0.0, {}))
    assert reg.names() == ("builtin", "fake")
    assert "fake" in reg and "drh_fake_plugin" not in sys.modules  # listed, not loaded
    assert reg.get("fake")(None, "", [], None, None, None) == (1.0, {})


def test_a_broken_plugin_names_its_distribution_and_fails_only_its_name(site):
    group = "drh.test.envs"
    _distribution(
        site, "broken-plugin", "drh_broken_plugin", "raise ImportError('no such thing')\n",
        {group: {"broken": "drh_broken_plugin:KIND"}},
    )  # fmt: skip
    _distribution(
        site, "other-plugin", "drh_other_plugin", "KIND = 42\n",
        {group: {"wrong": "drh_other_plugin:KIND"}},
    )  # fmt: skip
    reg = Registry("mode", group, check=envs._check)
    with pytest.raises(RegistryError) as e:
        reg.get("broken")
    assert "'broken-plugin'" in str(e.value) and "no such thing" in str(e.value)
    assert "drh_broken_plugin:KIND" in str(e.value)
    with pytest.raises(
        RegistryError, match=r"'other-plugin'.*expected a rollout\.registry\.EnvKind"
    ):
        reg.get("wrong")
    assert reg.names() == ("broken", "wrong")  # listing them loads neither


def test_two_plugins_with_one_name_are_an_error_naming_both(site):
    group = "drh.test.sources"
    for dist, module in (("fake-plugin", "drh_fake_plugin"), ("other-plugin", "drh_other_plugin")):
        _distribution(
            site, dist, module, "def f(r):\n    return []\n", {group: {"x": f"{module}:f"}}
        )
    reg = Registry("task source", group)
    with pytest.raises(RegistryError, match=r"more than one plugin.*'fake-plugin'.*'other-plugin'"):
        reg.get("x")


def test_the_real_registries_find_a_plugin_after_refresh(site, monkeypatch):
    task_sources.names()  # the in-tree ones registered before the state is saved
    monkeypatch.setattr(task_sources, "_entries", dict(task_sources._entries))
    monkeypatch.setattr(task_sources, "_plugins", task_sources._plugins)  # restored after
    _distribution(
        site, "fake-plugin", "drh_fake_plugin",
        """
        def tasks(request):
            return [{"id": f"{request.split}-{i}"} for i in range(request.n)]
        """,
        {"deep_research_harness.task_sources": {"fake_source": "drh_fake_plugin:tasks"}},
    )  # fmt: skip
    assert "fake_source" not in task_sources.names()  # the entry points were listed before
    task_sources.refresh()
    assert "fake_source" in task_sources.names()
    request = TaskRequest(cfg.RunConfig(), "http://127.0.0.1:8900", "dev", 2)
    assert task_sources.get("fake_source")(request) == [{"id": "dev-0"}, {"id": "dev-1"}]


# ----------------------------------------------------------------------------- environment kinds


@dataclass(frozen=True)
class Lookup(Action):
    """Look a key up in a table (a tool call, no web)."""

    name: ClassVar[str] = "lookup"
    key: str


TABLE = {"paris": "France", "lima": "Peru"}
TOOL_ACTIONS = (
    ActionSpec(
        Lookup, (Param("key", "text", "what to look up"),), "Look a key up.",
        'lookup("paris")', Lookup("paris"),
    ),
    ActionSpec(
        Answer, (Param("text", "text", "the final answer"),), "Answer.", 'answer("Peru")',
        Answer("Peru"),
    ),
)  # fmt: skip


class TableBackend:
    """A backend with neither a web nor a browser: it answers lookups from a dict."""

    url = None

    def __init__(self, ctx):
        self.ctx = ctx

    async def start(self, start_url):
        return Observation(f"Keys: {', '.join(TABLE)}", url=None)

    async def act(self, action):
        return Observation(f"{action.key}: {TABLE.get(action.key, 'not found')}", url=None)

    async def recover(self):
        pass

    async def close(self):
        pass


class TableOracle:
    def __init__(self, task, web_url, rollout, *, noisy=False, seed=0):
        self.task, self.asked = task, False

    def next(self, text):
        if not self.asked:
            self.asked = True
            return f'lookup("{self.task["key"]}")'
        return f'answer("{text.split(": ")[-1]}")'


def score_echo(task, body, cited, record, config, judgement):
    right = body.strip() == task["answer"]
    return float(right), {"echo": float(right)}


@contextlib.contextmanager
def registered(registry, name, obj):
    registry.register(name, obj)
    try:
        yield obj
    finally:
        registry.unregister(name)


TOOLS = EnvKind(
    "test_tools", TOOL_ACTIONS, TableBackend, dialect="call", opens_page=False, oracle=TableOracle
)


def test_the_in_tree_kinds_are_registered():
    assert envs.names()[:3] == ("api", "playwright", "som")
    assert (envs.get("api").dialect, envs.get("som").dialect) == ("xml", "som")
    assert [envs.get(m).browser for m in ("api", "playwright", "som")] == [False, True, True]
    assert set(ACTIONS) >= {"api", "playwright", "som"}


def test_a_kind_needs_an_answer_and_a_known_dialect():
    with pytest.raises(RegistryError, match="need an answer"):
        EnvKind("x", TOOL_ACTIONS[:1], TableBackend)
    with pytest.raises(RegistryError, match="dialect 'json'"):
        EnvKind("x", TOOL_ACTIONS, TableBackend, dialect="json")
    with pytest.raises(RegistryError, match="registered as 'y': names differ"):
        envs._check("y", TOOLS)


def test_an_unknown_kind_is_a_value_error_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown mode 'vision' \(env\.kind\); registered: api"):
        make_env("vision", "http://127.0.0.1:8900", cfg.EnvConfig())
    with pytest.raises(ValueError, match="unknown mode"):
        parse("click(3)", "vision")


async def test_a_kind_without_web_or_browser_runs_an_episode(tmp_path):
    task = {"id": "t1", "question": "Which country is Lima in?", "answer": "Peru",
            "type": "echo_test", "key": "lima"}  # fmt: skip
    with registered(envs, "test_tools", TOOLS), registered(verifiers, "echo_test", score_echo):
        assert "lookup(key: str)" in describe_actions("test_tools")
        assert parse('lookup("lima")', "test_tools") == Lookup("lima")
        assert isinstance(parse("search(1)", "test_tools"), ParseError)
        assert isinstance(browsers_for("test_tools", "", cfg.EnvConfig(), cfg.RolloutConfig()),
                          contextlib.nullcontext)  # fmt: skip
        env = make_env("test_tools", "http://127.0.0.1:1", cfg.EnvConfig(), run_dir=tmp_path)
        oracle = scripted_oracle("test_tools", task, "", cfg.RolloutConfig())
        first = await env.reset(task)  # no start_url: this kind opens no page
        r = await env.step(oracle.next(first.text))
        assert "lima: Peru" in r.text
        r = await env.step(oracle.next(r.text))
        await env.close()
    assert r.terminated and r.reward == 1.0 and r.info["reward_breakdown"]["echo"] == 1.0
    assert "test_tools" not in envs and "echo_test" not in verifiers


def test_a_kind_without_an_oracle_says_so():
    kind = EnvKind("test_no_oracle", TOOL_ACTIONS, TableBackend)
    with registered(envs, "test_no_oracle", kind), pytest.raises(ValueError, match="no scripted"):
        scripted_oracle("test_no_oracle", {}, "", cfg.RolloutConfig())


# ----------------------------------------------------------------------------- verifiers


def test_verify_and_page_rewards_use_registered_verifiers():
    task = {"id": "t", "question": "q?", "answer": "Peru", "type": "echo_test"}
    record = EpisodeRecord("e", task, "api")
    with pytest.raises(ValueError, match="unknown type 'echo_test'; expected one of qa"):
        verify(task, "Peru", record)
    with registered(verifiers, "echo_test", score_echo):
        reward = verify(task, "Peru", record)
        assert reward.value == 1.0 and reward.breakdown["echo"] == 1.0
        page_reward.validate({"verifier": "echo_test"})
    assert verifiers.names()[:4] == ("qa", "browse_comp", "citation", "multi_doc")


# ----------------------------------------------------------------------------- task sources, config


def test_the_file_task_source_reads_jsonl(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(3)))
    run = cfg.load(
        None, ["rollout.task_source=file", f"rollout.tasks_file={json.dumps(str(path))}"]
    )
    source = task_sources.get(run.rollout.task_source)
    assert [t["id"] for t in source(TaskRequest(run, "", "test", 2))] == ["t0", "t1"]
    assert len(source(TaskRequest(run, "", "test"))) == 3
    assert task_sources.names()[:2] == ("generated", "file")


def test_config_names_any_environment_and_task_source():
    run = cfg.load(None, ["env.kind=tools", "rollout.task_source=my_plugin"])
    assert (run.env.kind, run.env.mode, run.rollout.task_source) == ("tools", "tools", "my_plugin")
    assert cfg.load(None, ["env.mode=som"]).env.kind == "som"  # the older name still works
    assert cfg.load(None, []).env.kind == "api"
    with pytest.raises(cfg.ConfigError, match="name different environments"):
        cfg.load(None, ["env.kind=som", "env.mode=playwright"])


def test_eval_refuses_an_unregistered_kind_naming_the_registered_ones(capsys):
    with pytest.raises(SystemExit):
        rollout_eval.main(["--set", "env.kind=vision", "--n", "1"])
    assert "unknown mode 'vision' (env.kind); registered: api, playwright, som" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        rollout_eval.main(["--set", "rollout.task_source=nothing", "--n", "1"])
    assert "unknown task source 'nothing'" in capsys.readouterr().err


def test_the_entry_point_groups_are_the_documented_ones():
    assert ENV_GROUP == "deep_research_harness.envs"
    assert task_sources.group == "deep_research_harness.task_sources"
    assert verifiers.group == "deep_research_harness.verifiers"


def test_a_plugin_cannot_take_a_name_registered_in_the_tree(site):
    group = "drh.test.taken"
    _distribution(
        site, "fake-plugin", "drh_fake_plugin", "def f(r):\n    return []\n",
        {group: {"taken": "drh_fake_plugin:f", "free": "drh_fake_plugin:f"}},
    )  # fmt: skip
    reg = Registry("task source", group)
    reg.register("taken", print)
    with pytest.raises(RegistryError, match=r"'taken' is registered in the tree.*'fake-plugin'"):
        reg.get("taken")
    assert reg.get("free")([]) == []
    reg.register("taken", len, replace=True)  # code that means to win may
    assert reg.get("taken") is len
