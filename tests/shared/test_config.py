"""The run config: defaults, round trips, overrides and every failure mode's message."""

import argparse
import dataclasses
import typing
from pathlib import Path

import pytest

from shared import config as cfg
from shared.config import ConfigError, RunConfig

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_tiny_config_load():
    assert cfg.load() == RunConfig()
    tiny = cfg.load(REPO / "configs" / "tiny.toml")
    assert tiny.inference.backend == "embedded"
    assert tiny.env.mode == "api"


def test_every_config_file_in_the_repo_loads():
    files = sorted((REPO / "configs").glob("*.toml"))
    assert files
    for path in files:
        cfg.load(path)


def test_every_field_is_documented_and_optional_fields_default_to_none():
    for name, cls in cfg.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{name}.{f.name} has no documentation"
            if type(None) in typing.get_args(hints[f.name]):
                assert f.default is None, f"{name}.{f.name}: optional fields default to None"


def test_sections_are_frozen():
    c = RunConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.env.mode = "som"  # type: ignore[misc]


@pytest.mark.parametrize("config_name", ["defaults", "tiny", "modified"])
def test_toml_round_trip(tmp_path, config_name):
    if config_name == "defaults":
        c = RunConfig()
    elif config_name == "tiny":
        c = cfg.load(REPO / "configs" / "tiny.toml")
    else:
        c = cfg.load(
            None,
            [
                "env.mode=som",
                'env.allowed_hosts=["127.0.0.1", "example.org"]',
                "web.url=http://127.0.0.1:9000",
                'rollout.auth_token="s3cret \\" quote"',
                "learner.learning_rate=3e-5",
                "learner.length_buckets=[128, 512]",
                "logging.progress=false",
            ],
        )
    path = tmp_path / "run.toml"
    path.write_text(cfg.to_toml(c))
    assert cfg.load(path) == c
    # With documentation comments the file reads back the same.
    path.write_text(cfg.to_toml(c, with_docs=True))
    assert cfg.load(path) == c


def test_overrides_parse_toml_values_and_bare_words(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[env]\nmode = "playwright"\nmax_steps = 5\n')
    c = cfg.load(
        path,
        [
            "env.max_steps=12",
            "env.mode=som",  # a bare word is a string
            "env.screenshots=true",
            "learner.learning_rate=2e-4",
            "learner.clip_eps_high=1",  # an int where a float is declared
            'env.allowed_hosts=["a.test", "b.test"]',
            "search.url=http://127.0.0.1:1/api",
            "env.max_steps=20",  # the last --set wins
        ],
    )
    assert c.env.mode == "som"
    assert c.env.max_steps == 20
    assert c.env.screenshots is True
    assert c.learner.learning_rate == 2e-4
    assert c.learner.clip_eps_high == 1.0 and isinstance(c.learner.clip_eps_high, float)
    assert c.env.allowed_hosts == ("a.test", "b.test")
    assert c.search.url == "http://127.0.0.1:1/api"
    # Keys not overridden keep the file's values and the defaults.
    assert c.env.observation_chars == cfg.EnvConfig().observation_chars
    # bool | Literal["auto"]: either member's values load as themselves
    assert cfg.LearnerConfig().scan_layers == "auto"
    assert cfg.load(None, ["learner.scan_layers=false"]).learner.scan_layers is False
    assert cfg.load(None, ["learner.scan_layers=true"]).learner.scan_layers is True
    assert cfg.load(None, ["learner.scan_layers=auto"]).learner.scan_layers == "auto"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["envx.mode=api"], "unknown section [envx]; allowed sections: web, search, env"),
        (["env.modes=api"], "unknown key env.modes; allowed keys in [env]: mode, kind, max_steps"),
        # Any registered environment's name loads (plugins register at run time); its form
        # is checked here, whether it is registered where it is used.
        (["env.mode=no such"], "env.mode = 'no such': expected the name of a registered env"),
        (["env.kind=som", "env.mode=playwright"], "name different environments"),
        (["rollout.task_source=file"], "rollout.tasks_file is unset"),
        (["env.max_steps=0"], "env.max_steps = 0: expected a value in [1, 1000]"),
        (["env.max_steps=1001"], "env.max_steps = 1001: expected a value in [1, 1000]"),
        (["env.max_steps=2.5"], "env.max_steps = 2.5: expected an integer"),
        (["env.max_steps=true"], "env.max_steps = True: expected an integer"),
        (["env.max_steps=ten"], "env.max_steps = 'ten': expected an integer"),
        (["learner.learning_rate=0"], "learner.learning_rate = 0.0: expected a value in (0, 1]"),
        (["learner.learning_rate=nan"], "learner.learning_rate = nan: expected a finite number"),
        (["learner.learning_rate=fast"], "learner.learning_rate = 'fast': expected a number"),
        (["env.screenshots=1"], "env.screenshots = 1: expected true or false"),
        (["web.host=1"], "web.host = 1: expected a string"),
        (
            ["env.allowed_hosts=localhost"],
            "env.allowed_hosts = 'localhost': expected a list of str",
        ),
        (["env.allowed_hosts=[1]"], "env.allowed_hosts[0] = 1: expected a string"),
        (["web.port=70000"], "web.port = 70000: expected a value in [0, 65535]"),
        (["rollout.group_size=1"], "rollout.group_size = 1: expected a value in [2, 1024]"),
        (["mesh.process_id=2"], "mesh.process_id = 2: expected a value in [0, 0]"),
        (["inference.backend=tgi"], "inference.backend = 'tgi': expected one of"),
        (["learner.length_buckets=[512, 256]"], "learner.length_buckets = [512, 256]: expected"),
        (["inference.observation_tokens=2000"], "inference.observation_tokens = 2000: expected"),
        (["env=api"], "expected section.key=value, e.g. env.mode=som"),
        (["env.mode"], "expected section.key=value"),
        # a union (bool | Literal["auto"]) names what each member allows
        (
            ["learner.scan_layers=yes"],
            "learner.scan_layers = 'yes': expected true or false or one of 'auto'",
        ),
        (
            ["learner.scan_layers=1"],
            "learner.scan_layers = 1: expected true or false or one of 'auto'",
        ),
        (["a.b.c=1"], "expected section.key=value"),
    ],
)
def test_each_failure_names_the_key_and_what_is_allowed(overrides, message):
    with pytest.raises(ConfigError) as e:
        cfg.load(None, overrides)
    assert message in str(e.value)


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        cfg.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[env\nmode = 1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        cfg.load(bad)
    notable = tmp_path / "notable.toml"
    notable.write_text('env = "api"\n')
    with pytest.raises(ConfigError, match=r"\[env\] must be a table, got str"):
        cfg.load(notable)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[env]\nmode = 'api'\ncolour = 'red'\n")
    with pytest.raises(ConfigError, match=r"unknown\.toml: unknown key env\.colour"):
        cfg.load(unknown)


def _parser() -> argparse.ArgumentParser:
    return cfg.add_config_args(argparse.ArgumentParser(prog="entry"))


def test_cli_flags_are_shared_by_entry_points(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[env]\nmax_steps = 7\n")
    args = _parser().parse_args(
        ["--config", str(path), "--set", "env.mode=som", "--set", "env.max_steps=9"]
    )
    c = cfg.config_from_args(args)
    assert (c.env.mode, c.env.max_steps) == ("som", 9)


def test_cli_errors_exit_with_the_message(capsys):
    args = _parser().parse_args(["--set", "env.mode=no such"])
    with pytest.raises(SystemExit) as e:
        cfg.config_from_args(args)
    assert "config error" in str(e.value.code) and "env.mode = 'no such'" in str(e.value.code)


def test_print_config_shows_docs_and_exits(capsys):
    args = _parser().parse_args(["--print-config", "--set", "env.mode=som"])
    with pytest.raises(SystemExit) as e:
        cfg.config_from_args(args)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert 'mode = "som"' in out
    assert "# Action space" in out


def test_default_config_file_is_read_when_config_is_omitted(tmp_path):
    path = tmp_path / "default.toml"
    path.write_text("[env]\nmax_steps = 3\n")
    parser = cfg.add_config_args(argparse.ArgumentParser(), default=path)
    assert cfg.config_from_args(parser.parse_args([])).env.max_steps == 3
    other = tmp_path / "other.toml"
    other.write_text("[env]\nmax_steps = 4\n")
    args = parser.parse_args(["--config", str(other)])
    assert cfg.config_from_args(args).env.max_steps == 4


def test_entry_point_logging_leaves_out_the_backend_probe():
    """At INFO, JAX's probe of absent backends ("Unable to initialize backend 'tpu'") is
    not logged; the run's own INFO lines are."""
    import subprocess
    import sys

    code = (
        "import logging; from shared.config import RunConfig, load, setup_logging; "
        "setup_logging(load(None, ['logging.level=info'])); import jax; jax.devices(); "
        "logging.getLogger('learner.train').info('own line')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "own line" in done.stderr and "Unable to initialize backend" not in done.stderr
