"""The tool backend: each tool's observations, agreement with the local web's pages, and
errors an agent can correct itself from."""

import pytest

from rollout.env.core import ToolError
from rollout.tools import Airport, Calculate, ListCountries, Lookup, make_backend
from rollout.tools.backend import airport_url, figures_read
from rollout.tools.data import INDICATORS, atlas, number_text
from rollout.tracking.records import Step
from rollout.web.site import Site, _fields
from rollout.web.templates import environment
from rollout.web.text import visible_text


@pytest.fixture(scope="module")
def backend():
    return make_backend()


async def test_start_lists_the_indicators_and_has_no_url(backend):
    obs = await backend.start("tools://local")
    assert backend.url is None and obs.url is None
    assert all(name in obs.text for name in INDICATORS)
    assert "Europe" in obs.text


async def test_lookup_gives_a_plain_number_its_unit_and_the_source_text(backend):
    obs = await backend.act(Lookup("France", "gdp_official"))
    assert obs.text.startswith("France: gdp_official = 3162000000000 US dollars (")
    assert "$3.162 trillion (2024 est.)" in obs.text
    obs = await backend.act(Lookup("fr", "largest_city_population"))
    assert obs.text.startswith("France: largest_city_population = 2138551 people (Paris;")
    obs = await backend.act(Lookup("FRA", "Unemployment Rate"))
    assert obs.text.startswith("France: unemployment_rate = 7.4 % (")


async def test_names_are_matched_without_case_accents_or_the(backend):
    for name in ("france", "FRANCE", "Frànce", "the France", "  France "):
        assert (await backend.act(Lookup(name, "population"))).text.startswith("France:")


async def test_an_unknown_country_comes_with_suggestions(backend):
    with pytest.raises(ToolError, match=r"Unknown country 'Frnace'\. Did you mean: France"):
        await backend.act(Lookup("Frnace", "population"))


async def test_an_unknown_indicator_lists_the_indicators(backend):
    with pytest.raises(ToolError) as e:
        await backend.act(Lookup("France", "gdp_per_capita"))
    assert "Unknown indicator 'gdp_per_capita'" in str(e.value)
    assert all(name in str(e.value) for name in INDICATORS)


async def test_a_missing_figure_says_which_source_lacks_it(backend):
    with pytest.raises(ToolError, match="The World Factbook has no gdp_official figure"):
        await backend.act(Lookup("Western Sahara", "gdp_official"))


async def test_one_lookup_reads_a_list_of_countries_as_a_question_writes_it(backend):
    obs = await backend.act(Lookup(" Peru, Chile and Bolivia", "population"))
    lines = obs.text.splitlines()
    assert [line.split(":")[0] for line in lines] == ["Peru", "Chile", "Bolivia"]
    single = [
        (await backend.act(Lookup(n, "population"))).text for n in ("Peru", "Chile", "Bolivia")
    ]
    assert lines == single  # each line as its own lookup gives it
    for text, names in [
        ("Trinidad and Tobago, France and Bosnia and Herzegovina",
         ["Trinidad and Tobago", "France", "Bosnia and Herzegovina"]),  # "and" inside names
        ("France; Spain", ["France", "Spain"]),
        ("France, and Spain", ["France", "Spain"]),
        ("FR, ES, FR", ["France", "Spain"]),  # codes; a repeat read once
    ]:  # fmt: skip
        assert [n.name for n in map(backend.data.find, names)] == names
        assert backend.countries_named(text) == [backend.data.find(n) for n in names], text


async def test_a_list_lookup_names_the_item_it_cannot_read(backend):
    with pytest.raises(ToolError, match=r"Unknown country 'Spainn'\. Did you mean: Spain"):
        await backend.act(Lookup("France, Spainn and Peru", "population"))
    with pytest.raises(ToolError, match="6 countries in one lookup; at most 5"):
        await backend.act(Lookup("Peru, Chile, Bolivia, France, Spain and Italy", "population"))
    # a figure one of them lacks is a line of its own; the others are read
    obs = await backend.act(Lookup("France and Western Sahara", "gdp_official"))
    first, second = obs.text.splitlines()
    assert first.startswith("France: gdp_official = 3162000000000 US dollars (")
    assert second == (
        "Western Sahara: The World Factbook has no gdp_official figure for Western Sahara."
    )


async def test_list_countries_by_continent_prefix_or_both(backend):
    obs = await backend.act(ListCountries("South America"))
    assert obs.text.startswith("14 countries in South America: ")
    assert "Peru" in obs.text and "France" not in obs.text
    obs = await backend.act(ListCountries("Africa prefix:Ma"))
    assert obs.text.startswith("6 countries in Africa whose names start with 'ma': ")
    assert "Madagascar" in obs.text and "Malaysia" not in obs.text
    obs = await backend.act(ListCountries("Ke"))
    assert obs.text == "1 country whose names start with 'ke': Kenya"
    obs = await backend.act(ListCountries("continent:EU prefix:zz"))
    assert obs.text.startswith("No country in Europe whose names start with 'zz'.")


async def test_list_countries_is_bounded(backend):
    small = make_backend(observation_chars=300)
    obs = await small.act(ListCountries(""))
    assert len(obs.text) <= 300
    assert "more (narrow the filter" in obs.text
    with pytest.raises(ToolError, match="Unknown continent 'Atlantis'"):
        await backend.act(ListCountries("continent:Atlantis"))


async def test_calculate_shows_the_expression_and_its_value(backend):
    obs = await backend.act(Calculate("3162000000000 / 66987244"))
    assert obs.text == f"3162000000000 / 66987244 = {3162000000000 / 66987244!r}"
    assert (await backend.act(Calculate("(1 + 2) *\n 3"))).text == "(1 + 2) * 3 = 9"
    with pytest.raises(ToolError, match="calculate: unknown name 'gdp'"):
        await backend.act(Calculate("gdp / 2"))
    with pytest.raises(ToolError, match="thousands separators"):
        await backend.act(Calculate("66,987,244 / 2"))


def test_every_country_is_found_by_its_own_name():
    data = atlas()
    assert all(data.find(data.name(c)) is c for c in data.countries)


def test_figures_match_what_the_local_web_shows():
    """Atlas country pages and Factbook pages, rendered for a few countries."""
    data = atlas()
    site = Site.__new__(Site)  # render single pages, not the whole site
    site.world, site.env, site.pages = data.world, environment(), {}
    for iso in ("FR", "JP", "BR", "KE", "NZ"):
        c = data.world.countries[iso]
        atlas_text = visible_text(site._geo_country(c))[0]
        for ind in ("population", "area_km2"):
            assert number_text(data.value(c, ind).number) in atlas_text
        city = data.value(c, "largest_city_population")
        assert city.detail in atlas_text
        shown = {v for _, rows in _fields(c.factbook["Economy"]) for _, v in rows}
        for ind in ("gdp_ppp", "gdp_official", "exports", "imports", "unemployment_rate"):
            value = data.value(c, ind)
            if value is not None:
                assert value.source_text in shown, (iso, ind)


async def test_airport_names_the_city_and_the_country_a_lookup_takes(backend):
    data = atlas()
    cdg = data.world.airports["CDG"]
    obs = await backend.act(Airport(" cdg "))
    assert obs.text == (
        f"CDG: {cdg.name}, {cdg.city_name}, in France; "
        'lookup("France", indicator) reads its figures.'
    )
    for bad in ("ZZZZ", "C D", "", "Paris"):
        with pytest.raises(ToolError, match=r"Unknown airport code .* three-letter IATA"):
            await backend.act(Airport(bad))


def test_an_airport_step_reaches_its_record():
    ok = Step(1, "", "airport", {"code": "cdg"})
    assert figures_read(ok) == [airport_url("CDG")] == ["tools://airports/CDG"]
    failed = Step(1, "", "airport", {"code": "cdg"}, error="tool_error")
    assert figures_read(failed) == []
    assert figures_read(Step(1, "", "airport", {"code": "QQQ"})) == []


async def test_observations_are_deterministic():
    a, b = make_backend(), make_backend()
    for action in (Lookup("Peru", "exports"), ListCountries("Asia"), Calculate("2 ** 0.5")):
        assert (await a.act(action)) == (await b.act(action))
