"""The documentation: the configuration reference is what ``shared.config_reference``
generates from the option declarations now (every section and key in it), and the
README's links into ``docs/`` lead to pages that exist. ``make test`` also builds the
site with ``mkdocs build --strict`` (broken links and anchors between pages fail it)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from shared import config as cfg
from shared import config_reference

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reference" / "configuration.md"


def test_the_committed_configuration_reference_is_the_generated_one():
    assert config_reference.PAGE == PAGE
    assert PAGE.read_text(encoding="utf-8") == config_reference.render(), (
        "docs/reference/configuration.md is stale: run python -m shared.config_reference"
    )


def test_every_key_of_every_section_is_in_the_reference_under_its_section():
    text = PAGE.read_text(encoding="utf-8")
    sections = dict(re.findall(r"\n## (\w+)\n(.*?)(?=\n## |\Z)", text, re.S))
    assert list(sections) == list(cfg.SECTIONS)
    for name, cls in cfg.SECTIONS.items():
        rows = {m[1]: m[0] for m in re.finditer(r"^\| `([\w.]+)` \|.*$", sections[name], re.M)}
        keys = [f"{name}.{f.name}" for f in dataclasses.fields(cls)]
        assert list(rows) == keys, name
        for f in dataclasses.fields(cls):
            row = rows[f"{name}.{f.name}"]
            default = "unset" if f.default is None else f"`{cfg._toml_value(f.default)}`"
            assert f"| {default} |" in row, (row, default)
            first_words = " ".join(f.metadata["doc"].split()[:3]).replace("``", "`")
            assert first_words.replace("*", "\\*").replace("<", "&lt;") in row, row


def test_the_reference_shows_bounds_and_choices():
    text = PAGE.read_text(encoding="utf-8")
    # web.port: ge=0, le=65535; search.timeout_s: gt=0; search.backend: a Literal.
    assert "| `web.port` | integer | `8900` | [0, 65535] |" in text
    assert "| `search.timeout_s` | number | `5.0` | (0, inf) |" in text
    assert '| `search.backend` | string | `"local"` | `local`, `searxng`, `serper`,' in text
    assert '| `learner.scan_layers` | boolean or string | `"auto"` | `true`, `false`, `auto` |' in (
        text
    )


def test_check_mode_fails_on_a_stale_page(tmp_path):
    page = tmp_path / "configuration.md"
    assert config_reference.main(["--out", str(page)]) == 0
    assert config_reference.main(["--check", "--out", str(page)]) == 0
    page.write_text(page.read_text() + "an edit by hand\n")
    assert config_reference.main(["--check", "--out", str(page)]) == 1


def test_the_readme_links_into_docs_lead_to_pages():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme)
    assert links, "the README links into docs/"
    missing = sorted({link for link in links if not (REPO / link).is_file()})
    assert not missing, missing
