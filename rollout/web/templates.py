"""HTML templates of the local web's sites (jinja2, autoescaped).

Each site has its own look (a stylesheet and a header of its own), navigation,
breadcrumbs and a site-internal search box. Facts that tasks quote are written
as plain sentences inside one paragraph with no inline markup, so every
HTML-to-text conversion (a browser's innerText, Markdown converters) keeps them
verbatim; links and tables sit beside them.
"""

from __future__ import annotations

import re

import jinja2


def slug(text: str) -> str:
    """An anchor id: lowercase words joined by hyphens ("Executive branch" -> "executive-branch")."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


SITES = {
    "geo": "Atlas",
    "factbook": "World Factbook",
    "airports": "AirportDB",
    "elements": "Elements",
    "docs": "Python docs",
    "members": "Factbook Members",
    "search": "Seek",
}

LAYOUT = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>{{ title }} - {{ site_name }}</title>
<link rel="stylesheet" href="/static/{{ site }}.css"></head>
<body class="site-{{ site }}">
<header class="top"><a class="brand" href="/{{ site }}/">{{ site_name }}</a>
<nav class="sites">{% for key, name in sites %}<a href="/{{ key }}/">{{ name }}</a> {% endfor %}<a href="/">Seek</a></nav>
{% if site != "search" %}<form class="site-search" action="/{{ site }}/search" method="get" role="search">
<input type="search" name="q" aria-label="Search {{ site_name }}" placeholder="Search {{ site_name }}">
<button type="submit">Search</button></form>{% endif %}
</header>
<nav class="breadcrumbs" aria-label="Breadcrumb">{% for href, label in crumbs %}{% if not loop.first %} &rsaquo; {% endif %}{% if href %}<a href="{{ href }}">{{ label }}</a>{% else %}<span>{{ label }}</span>{% endif %}{% endfor %}</nav>
<main>
{% block main %}{% endblock %}
</main>
<footer><p>{{ site_name }} is part of the local web. Data: GeoNames, CIA World Factbook, airportsdata, mendeleev, Python documentation.</p></footer>
{% block scripts %}{% endblock %}
</body>
</html>
"""

GEO_COUNTRY = """{% extends "layout" %}{% block main %}
<h1>{{ c.name }}</h1>
<p class="lead">{{ lead }}</p>
<table class="infobox"><caption>Country profile</caption>
<tr><th>Capital</th><td>{% if capital %}<a href="/geo/city/{{ capital.id }}">{{ capital.name }}</a>{% else %}{{ c.capital or "none" }}{% endif %}</td></tr>
<tr><th>Continent</th><td><a href="/geo/continent/{{ c.continent }}">{{ continent }}</a></td></tr>
<tr><th>Area</th><td>{{ area }} km²</td></tr>
<tr><th>Population</th><td>{{ population }}</td></tr>
<tr><th>Currency</th><td>{{ c.currency_name or "none" }} ({{ c.currency_code or "-" }})</td></tr>
<tr><th>ISO code</th><td>{{ c.iso }} / {{ c.iso3 }}</td></tr>
</table>
{% if neighbours %}<h2>Neighbouring countries</h2>
<p>{{ neighbour_sentence }}</p>
<table class="list"><tr><th>Country</th><th>Area (km²)</th><th>Capital</th></tr>
{% for n, n_area in neighbours %}<tr><td><a href="/geo/country/{{ n.iso }}">{{ n.name }}</a></td><td>{{ n_area }}</td><td>{{ n.capital or "none" }}</td></tr>
{% endfor %}</table>{% endif %}
<h2>Cities</h2>
{% if cities %}<ol class="cities">{% for city in cities %}<li><a href="/geo/city/{{ city.id }}">{{ city.name }}</a></li>{% endfor %}</ol>
<p><a href="/geo/country/{{ c.iso }}/cities?page=1">All {{ n_cities }} cities of {{ c.name }}</a></p>{% else %}<p>No cities are listed for {{ c.name }}.</p>{% endif %}
<h2>More about {{ c.name }}</h2>
<ul class="see-also">
{% if c.factbook %}<li><a href="/factbook/{{ c.iso | lower }}">{{ c.name }} in the World Factbook</a></li>{% endif %}
{% if c.airports %}<li><a href="/airports/country/{{ c.iso }}?page=1">Airports in {{ c.name }} ({{ c.airports | length }})</a></li>{% endif %}
{% for e in elements %}<li><a href="/elements/{{ e.symbol }}">{{ e.name }}, discovered in {{ c.name }}</a></li>{% endfor %}
</ul>
{% endblock %}"""

GEO_CITY = """{% extends "layout" %}{% block main %}
<h1>{{ city.name }}</h1>
<p class="lead">{{ lead }}</p>
<table class="infobox"><caption>City facts</caption>
<tr><th>Country</th><td><a href="/geo/country/{{ country.iso }}">{{ country.name }}</a></td></tr>
<tr><th>Population</th><td>{{ population }}</td></tr>
<tr><th>Time zone</th><td>{{ city.timezone }}</td></tr>
<tr><th>Coordinates</th><td>{{ "%.4f" | format(city.latitude) }}, {{ "%.4f" | format(city.longitude) }}</td></tr>
</table>
{% if airports %}<h2>Airports</h2><ul>{% for a in airports %}<li><a href="/airports/{{ a.iata }}">{{ a.name }} ({{ a.iata }})</a></li>{% endfor %}</ul>{% endif %}
{% if prev or next %}<p class="list-nav">{% if prev %}<a rel="prev" href="/geo/city/{{ prev.id }}">Previous: {{ prev.name }}</a>{% endif %}{% if prev and next %} | {% endif %}{% if next %}<a rel="next" href="/geo/city/{{ next.id }}">Next: {{ next.name }}</a>{% endif %}</p>{% endif %}
{% endblock %}"""

GEO_LIST = """{% extends "layout" %}{% block main %}
<h1>{{ heading }}</h1>
{% if intro %}<p>{{ intro }}</p>{% endif %}
<ol start="{{ start }}">{% for href, label in items %}<li><a href="{{ href }}">{{ label }}</a></li>{% endfor %}</ol>
<nav class="pagination" aria-label="Pages">{% if prev %}<a rel="prev" href="{{ prev }}">Previous page</a> {% endif %}<span>Page {{ page }} of {{ pages }}</span>{% if next %} <a rel="next" href="{{ next }}">Next page</a>{% endif %}</nav>
{% endblock %}"""

FACTBOOK_COUNTRY = """{% extends "layout" %}{% block main %}
<h1>{{ c.name }}</h1>
<p class="lead">This is the World Factbook entry for {{ c.name }}. <a href="/geo/country/{{ c.iso }}">Atlas profile</a></p>
<nav class="toc"><ul>{% for name, _ in sections %}<li><a href="#{{ name | slug }}">{{ name }}</a></li>{% endfor %}</ul></nav>
{% for name, body in sections %}<section id="{{ name | slug }}"><h2>{{ name }}</h2>
{% for sub, fields in body %}<h3 id="{{ name | slug }}-{{ sub | slug }}">{{ sub }}</h3>
{% for label, value in fields %}<p class="field">{% if label %}<span class="label">{{ label }}:</span> {% endif %}{{ value }}</p>
{% endfor %}{% endfor %}</section>
{% endfor %}
{% endblock %}"""

AIRPORT = """{% extends "layout" %}{% block main %}
<h1>{{ a.name }} ({{ a.iata }})</h1>
<p class="lead">{{ lead }}</p>
<ul class="facts">
<li>City: {% if city %}<a href="/geo/city/{{ city.id }}">{{ a.city_name }}</a>{% else %}{{ a.city_name }}{% endif %}</li>
<li>Country: <a href="/airports/country/{{ country.iso }}?page=1">{{ country.name }}</a> (<a href="/geo/country/{{ country.iso }}">country profile</a>)</li>
</ul>
<section id="details" data-src="/airports/api/{{ a.iata }}.json"><h2>Details</h2><p class="loading">Loading details...</p></section>
{% endblock %}
{% block scripts %}<script src="/static/details.js"></script>{% endblock %}"""

ELEMENT = """{% extends "layout" %}{% block main %}
<h1>{{ e.name }} ({{ e.symbol }})</h1>
<p class="lead">{{ lead }}</p>
<p>{{ discovery }}</p>
<table class="infobox"><caption>Element facts</caption>
<tr><th>Atomic number</th><td>{{ e.number }}</td></tr>
<tr><th>Symbol</th><td>{{ e.symbol }}</td></tr>
<tr><th>Atomic weight</th><td>{{ weight }}</td></tr>
<tr><th>Period, group, block</th><td>{{ e.period }}, {{ e.group or "-" }}, {{ e.block }}</td></tr>
<tr><th>Discovered</th><td>{{ e.discovery_year or "ancient times" }}</td></tr>
<tr><th>Discovery location</th><td>{% if country %}<a href="/geo/country/{{ country.iso }}">{{ e.discovery_location }}</a>{% else %}{{ e.discovery_location or "unknown" }}{% endif %}</td></tr>
</table>
{% if e.name_origin %}<h2>Name origin</h2><p>{{ e.name_origin }}</p>{% endif %}
{% if e.uses %}<h2>Uses</h2><p>{{ e.uses }}</p>{% endif %}
<section id="details" data-src="/elements/api/{{ e.symbol }}.json"><h2>Properties</h2><p class="loading">Loading properties...</p></section>
<p><a href="/elements/{{ prev.symbol }}">Previous: {{ prev.name }}</a> | <a href="/elements/{{ next.symbol }}">Next: {{ next.name }}</a></p>
{% endblock %}
{% block scripts %}<script src="/static/details.js"></script>{% endblock %}"""

INDEX = """{% extends "layout" %}{% block main %}
<h1>{{ heading }}</h1>
<p>{{ intro }}</p>
{% if filters %}<div class="filters" role="toolbar">{% for f in filters %}<button type="button" data-filter="{{ f }}">{{ f }}</button> {% endfor %}<button type="button" data-filter="">all</button></div>{% endif %}
<ul class="{{ list_class }}">{% for href, label, tag in items %}<li data-tag="{{ tag }}"><a href="{{ href }}">{{ label }}</a></li>
{% endfor %}</ul>
{% endblock %}
{% block scripts %}{% if filters %}<script src="/static/filter.js"></script>{% endif %}{% endblock %}"""

SEARCH_HOME = """{% extends "layout" %}{% block main %}
<h1>Seek</h1>
<p>Search every site of the local web: the Atlas, the World Factbook, AirportDB, Elements and the Python documentation.</p>
<form action="/search" method="get" role="search"><input type="search" name="q" aria-label="Search query" autofocus> <button type="submit">Search</button></form>
{% endblock %}"""

RESULTS = """{% extends "layout" %}{% block main %}
<h1>Results for "{{ q }}"</h1>
<form action="{{ action }}" method="get" role="search"><input type="search" name="q" value="{{ q }}" aria-label="Search query"> <button type="submit">Search</button></form>
{% if results %}<ol class="results" start="{{ start }}">{% for r in results %}<li><a href="{{ r.url }}">{{ r.title }}</a><div class="url">{{ r.url }}</div><p>{{ r.snippet }}</p></li>
{% endfor %}</ol>{% else %}<p>No results.</p>{% endif %}
<nav class="pagination" aria-label="Pages">{% if prev %}<a rel="prev" href="{{ prev }}">Previous page</a> {% endif %}<span>Page {{ page }}</span>{% if next %} <a rel="next" href="{{ next }}">Next page</a>{% endif %}</nav>
{% endblock %}"""

LOGIN = """{% extends "layout" %}{% block main %}
<h1>Members' sign in</h1>
{% if error %}<p class="error" role="alert">{{ error }}</p>{% endif %}
<p>The members' area holds the editors' notes on every country. Demo account: user name reader, password factbook.</p>
<form action="/members/login" method="post">
<input type="hidden" name="next" value="{{ next }}">
<label>User name <input name="username" autocomplete="username"></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<button type="submit">Sign in</button></form>
{% endblock %}"""

WALL = """{% extends "layout" %}{% block main %}
<h1>Members only</h1>
<p>This page is for signed-in members. <a href="/members/login?next={{ next | urlencode }}">Sign in</a> to read it.</p>
{% endblock %}"""

NOTES = """{% extends "layout" %}{% block main %}
<h1>Editors' notes: {{ c.name }}</h1>
<p>Signed in as {{ user }}. <a href="/members/logout">Sign out</a></p>
<p>{{ note }}</p>
<p><a href="/members/">All notes</a></p>
{% endblock %}"""

STYLES = {
    "geo": "body{font-family:Georgia,serif;margin:0 8%;background:#fbfaf5}header.top{background:#2d5a27;color:#fff;padding:8px}header a{color:#fff}.infobox{float:right;border:1px solid #aaa;background:#f4f4ea}",
    "factbook": "body{font-family:Verdana,sans-serif;margin:0 5%;background:#f2f5fa}header.top{background:#1c2f4a;padding:10px}header a{color:#ffd}.field .label{font-weight:bold}",
    "airports": "body{font-family:Arial,sans-serif;margin:0 6%}header.top{background:#004e7c;padding:6px}header a{color:#fff}#details table{border-collapse:collapse}",
    "elements": "body{font-family:Helvetica,sans-serif;margin:0 4%;background:#fff8f0}header.top{background:#7a2e0e;padding:8px}header a{color:#fff}ul.table{display:grid;grid-template-columns:repeat(18,1fr);list-style:none}",
    "members": "body{font-family:sans-serif;margin:0 10%}header.top{background:#333;padding:8px}header a{color:#eee}.error{color:#b00}",
    "search": "body{font-family:sans-serif;margin:0 12%}header.top{border-bottom:2px solid #46a;padding:8px}.results .url{color:#070;font-size:small}",
    "docs": "",
}

DETAILS_JS = """(async function () {
  const box = document.getElementById("details");
  if (!box) return;
  const data = await (await fetch(box.dataset.src)).json();
  const rows = Object.entries(data).map(([k, v]) => `<tr><th>${k}</th><td>${v}</td></tr>`);
  box.innerHTML = `<h2>${box.querySelector("h2").textContent}</h2><table>${rows.join("")}</table>`;
})();
"""

FILTER_JS = """document.querySelectorAll("[data-filter]").forEach(function (b) {
  b.addEventListener("click", function () {
    const f = b.dataset.filter;
    document.querySelectorAll("li[data-tag]").forEach(function (li) {
      li.hidden = f !== "" && li.dataset.tag !== f;
    });
  });
});
"""

TEMPLATES = {
    "layout": LAYOUT,
    "geo_country": GEO_COUNTRY,
    "geo_city": GEO_CITY,
    "list": GEO_LIST,
    "factbook_country": FACTBOOK_COUNTRY,
    "airport": AIRPORT,
    "element": ELEMENT,
    "index": INDEX,
    "search_home": SEARCH_HOME,
    "results": RESULTS,
    "login": LOGIN,
    "wall": WALL,
    "notes": NOTES,
}


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.DictLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["slug"] = slug
    env.globals["sites"] = [(k, v) for k, v in SITES.items() if k not in ("members", "search")]
    return env
