"""Reading fetched pages: kinds, charsets, PDFs and the two HTML readers, on real bytes
(PDFs written here by hand, pages encoded in the charsets the web uses)."""

from __future__ import annotations

import io
import random
import zipfile

import pytest
from pypdf import PdfReader, PdfWriter

from rollout.env import reader
from rollout.env.reader import Page, Unreadable, read_page

URL = "https://example.test/page"


def make_pdf(pages: list[str | None], title: str | None = None) -> bytes:
    """A valid PDF, written by hand: one Helvetica line per page (None: a page with no
    text), an xref table with each object's offset, an /Info title."""
    objects = [b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", b""]  # 1, 2: Pages
    kids = []
    for text in pages:
        line = b"" if text is None else b"BT /F1 12 Tf 72 720 Td (%s) Tj ET" % text.encode()
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(line), line))
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 1 0 R >> >> /Contents %d 0 R >>" % len(objects)
        )
        kids.append(b"%d 0 R" % len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), len(kids))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    trailer = b"/Root %d 0 R" % len(objects)
    if title is not None:
        objects.append(b"<< /Title (%s) >>" % title.encode())
        trailer += b" /Info %d 0 R" % len(objects)
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, obj in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d %s >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, trailer, xref,
    )  # fmt: skip
    return bytes(out)


def encrypt(pdf: bytes, user_password: str) -> bytes:
    """The PDF encrypted by pypdf (RC4: AES would need the cryptography package)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    writer.encrypt(user_password, "owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def page(body: str, head: str = "") -> str:
    return (
        f"<!DOCTYPE html><html><head>{head}<title>A page</title></head><body>{body}</body></html>"
    )


# --- kinds --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body", "kind"),
    [
        ("text/html; charset=utf-8", b"<p>hi</p>", "html"),
        ("TEXT/HTML", b"<p>hi</p>", "html"),
        ("application/xhtml+xml", b"<p>hi</p>", "html"),
        ("text/plain", b"hi", "text"),
        ("text/markdown; charset=UTF-8", b"# hi", "text"),
        ("text/csv", b"a,b\n1,2", "text"),
        ("text/xml", b"<a>hi</a>", "text"),
        ("application/xml", b"<a>hi</a>", "text"),
        ("application/rss+xml", b"<rss>hi</rss>", "text"),
        ("application/ld+json", b'{"a": 1}', "text"),
        (None, b"\xef\xbb\xbf \n<!doctype HTML><p>hi</p>", "html"),  # sniffed, BOM and all
        ("application/octet-stream", b"  <html lang=en><p>hi</p>", "html"),
        ("binary/octet-stream", b"<!-- x --><p>hi</p>", "html"),
        ("application/octet-stream", make_pdf(["Hello"]), "pdf"),
        (None, b"just some plain words", "text"),  # no bytes a text never has
        (None, "\ufeffplain words".encode("utf-16-le"), "text"),
        ("text/html", make_pdf(["Hello"]), "pdf"),  # a PDF mislabelled
    ],
)
def test_the_kind_of_a_page_comes_from_its_type_or_its_first_bytes(content_type, body, kind):
    assert read_page(body, content_type, URL).kind == kind


def _zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("a.txt", "hello")
    return out.getvalue()


@pytest.mark.parametrize(
    ("content_type", "body", "named"),
    [
        ("image/png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png"),
        ("application/zip", _zip(), "application/zip"),
        ("video/mp4; codecs=avc1", b"\x00\x00\x00\x18ftypmp42", "video/mp4"),
        ("application/octet-stream", random.Random(0).randbytes(4096), "application/octet-stream"),
        (None, b"\x00\x01" + random.Random(1).randbytes(500), "unknown"),
    ],
)
def test_pages_that_are_not_html_pdf_or_text_are_refused_by_type(content_type, body, named):
    with pytest.raises(Unreadable, match=f"cannot read a page of type {named}: .*HTML, PDF"):
        read_page(body, content_type, URL)


# --- PDFs ---------------------------------------------------------------------------


def test_a_pdf_is_read_with_its_title():
    got = read_page(make_pdf(["Hello from a PDF"], title="A report"), "application/pdf", URL)
    assert got == Page("A report", "Hello from a PDF", "pdf", None)


def test_the_pages_of_a_pdf_are_marked():
    got = read_page(make_pdf(["First page", "Second page"]), "application/pdf", URL)
    assert got.text == "First page\n\n--- page 2 ---\n\nSecond page"
    assert got.title is None


def test_a_long_pdf_is_cut_and_says_so(monkeypatch):
    monkeypatch.setattr(reader, "MAX_PDF_PAGES", 2)
    got = read_page(make_pdf(["one", "two", "three"]), "application/pdf", URL)
    assert "three" not in got.text
    assert got.text.endswith("--- cut: the PDF has 3 pages; only the first 2 were read ---")


def test_a_pdf_encrypted_with_an_empty_user_password_opens():
    """Owner-only protection (no printing, no copying) does not stop a reader."""
    got = read_page(encrypt(make_pdf(["Restricted but open"]), ""), "application/pdf", URL)
    assert got.text == "Restricted but open"


@pytest.mark.parametrize(
    ("pdf", "reason"),
    [
        (encrypt(make_pdf(["Secret"]), "secret"), "it is protected by a password"),
        (make_pdf(["Hello", "World"])[:300], r"it is damaged \(.+\)"),
        (b"%PDF-1.4\nthis is no PDF at all", r"it is damaged \(.+\)"),
        (make_pdf(["Hello"]).replace(b"/Pages", b"/Pxges"), r"it is damaged \(.+\)"),
        (make_pdf([None, None]), r"it has no text layer \(a scan\?\)"),
        (make_pdf([]), "it has no pages"),
    ],
    ids=["password", "truncated", "garbage", "bad-tree", "no-text", "no-pages"],
)
def test_pdfs_that_cannot_be_read_say_why(pdf, reason):
    with pytest.raises(Unreadable, match=f"^cannot read this PDF: {reason}$"):
        read_page(pdf, "application/pdf", URL)


# --- charsets -----------------------------------------------------------------------

# (charset label a server sends, the codec a browser decodes it with, text in it)
CHARSETS = [
    ("windows-1252", "cp1252", "Le café coûte 3 € à Paris, près de la gare; déjà fermé."),
    ("shift_jis", "cp932", "日本語のテキストです。東京は日本の首都で、人口が多い都市です。"),
    ("gbk", "gb18030", "这是中文文本。北京是中国的首都,也是一座历史悠久的城市。"),
    ("koi8-r", "koi8-r", "Москва - столица России. Это очень большой и старый город."),
    ("windows-1251", "cp1251", "Москва - столица России. Это очень большой и старый город."),
]


@pytest.mark.parametrize(("label", "codec", "text"), CHARSETS, ids=[c[0] for c in CHARSETS])
@pytest.mark.parametrize("declared_by", ["header", "meta", "http-equiv", "nothing"])
def test_a_page_in_a_legacy_charset_is_decoded(label, codec, text, declared_by):
    head = {
        "meta": f'<meta charset="{label}">',
        "http-equiv": f'<meta http-equiv="Content-Type" content="text/html; charset={label}">',
    }.get(declared_by, "")
    body = page(f"<p>{text}</p><p>{text}</p>", head).encode(codec)
    content_type = f"text/html; charset={label}" if declared_by == "header" else "text/html"
    got = read_page(body, content_type, URL)
    assert got.text == f"{text}\n\n{text}"
    assert got.charset == codec


@pytest.mark.parametrize(
    ("label", "raw", "text", "codec"),
    [
        ("ISO-8859-1", b"\x80 and caf\xe9", "€ and café", "cp1252"),  # as windows-1252
        ("latin-1", b"\x93quoted\x94", "\u201cquoted\u201d", "cp1252"),
        ('"Shift_JIS"', "半角ｶﾅと全角".encode("cp932"), "半角ｶﾅと全角", "cp932"),
        ("euc-kr", "서울은 한국의 수도".encode("cp949"), "서울은 한국의 수도", "cp949"),
        ("gb2312", "北京".encode("gb18030"), "北京", "gb18030"),
        ("x-mac-cyrillic", "Мир".encode("mac-cyrillic"), "Мир", "mac-cyrillic"),
    ],
)
def test_charset_labels_are_decoded_as_browsers_decode_them(label, raw, text, codec):
    got = read_page(b"<p>" + raw + b"</p>", f"text/html; charset={label}", URL)
    assert (got.text, got.charset) == (text, codec)


@pytest.mark.parametrize(
    ("bom_codec", "codec"),
    [("utf-8-sig", "utf-8"), ("utf-16", "utf-16-le"), ("utf-16-be", "utf-16-be")],
)
def test_a_bom_decides_the_charset_over_the_header(bom_codec, codec):
    body = page("<p>Zoë — 東京</p>").encode(bom_codec)
    if bom_codec == "utf-16-be":
        body = b"\xfe\xff" + body
    got = read_page(body, "text/html; charset=iso-8859-1", URL)
    assert (got.text, got.charset) == ("Zoë — 東京", codec)


def test_a_wrong_header_charset_gives_way_to_detection():
    """Sent as UTF-8, written in windows-1252: nearly every non-ASCII byte fails."""
    text = CHARSETS[0][2]
    got = read_page(page(f"<p>{text}</p>").encode("cp1252"), "text/html; charset=utf-8", URL)
    assert (got.text, got.charset) == (text, "cp1252")


def test_valid_utf8_wins_over_a_declared_legacy_charset():
    """Shift_JIS decodes these UTF-8 bytes almost without a failure, into nonsense."""
    text = CHARSETS[0][2] + CHARSETS[1][2]
    got = read_page(page(f"<p>{text}</p>").encode(), "text/html; charset=shift_jis", URL)
    assert (got.text, got.charset) == (text, "utf-8")


def test_a_wrong_header_charset_gives_way_to_the_meta_tag():
    body = page("<p>Москва</p>", '<meta charset="koi8-r">').encode("koi8-r")
    got = read_page(body, "text/html; charset=utf-8", URL)
    assert (got.text, got.charset) == ("Москва", "koi8-r")


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "text/html"])
def test_one_stray_byte_does_not_throw_utf8_away(content_type):
    text = "Ünïcödé ïs ëvërywhërë " * 20
    body = page(f"<p>{text}\xff</p>").encode("utf-8").replace(b"\xc3\xbf", b"\xff")
    got = read_page(body, content_type, URL)
    assert (got.text, got.charset) == (text + "\ufffd", "utf-8")


def test_undeclared_utf8_cut_inside_a_character_and_plain_ascii_are_utf8():
    got = read_page("<p>Zürich 東京".encode()[:-2], "text/html", URL)
    assert (got.text, got.charset) == ("Zürich 東\ufffd", "utf-8")
    assert read_page(b"<p>plain</p>", "text/html", URL).charset == "utf-8"
    got = read_page(page("<p>é</p>", '<meta charset="utf-16">').encode(), "text/html", URL)
    assert (got.text, got.charset) == ("é", "utf-8")  # a meta read as ASCII is no UTF-16


@pytest.mark.parametrize("label", ["x-bogus", "base64", "rot13", "undefined", "unicode-escape"])
def test_an_unknown_or_unsafe_charset_label_is_ignored(label):
    body = page("<p>caf\\u00e9 déjà</p>").encode("utf-8")
    got = read_page(body, f"text/html; charset={label}", URL)
    assert (got.text, got.charset) == ("caf\\u00e9 déjà", "utf-8")


def test_a_meta_charset_in_a_comment_is_ignored():
    body = page("<p>Grüße</p>", '<!-- <meta charset="koi8-r"> -->').encode("utf-8")
    assert read_page(body, "text/html", URL).charset == "utf-8"


# --- text pages ---------------------------------------------------------------------


def test_a_text_page_is_read_as_is_in_its_charset():
    got = read_page("Привет,\n\n\n\nмир".encode("koi8-r"), "text/plain; charset=koi8-r", URL)
    assert got == Page(None, "Привет,\n\n\n\nмир", "text", "koi8-r")


def test_json_is_shown_as_served():
    body = '{"city": "Zürich", "n": [1, 2]}'
    assert read_page(body.encode(), "application/json", URL).text == body
    assert read_page(b'{"a": nope', "application/json", URL).text == '{"a": nope'


# --- the two HTML readers -----------------------------------------------------------

ARTICLE = (
    "<h1>The Loire</h1>"
    "<p>The Loire is the longest river in France, flowing for about a thousand kilometres "
    "from the Massif Central to the Atlantic Ocean near Saint-Nazaire.</p>"
    "<p>Its valley, a World Heritage Site, is famous for its chateaux, its vineyards and "
    "the towns of Orleans, Blois, Tours and Angers along its banks.</p>"
    "<table><tr><th>Length</th><td>1,006 km</td></tr><tr><th>Basin</th><td>117,000 km2</td>"
    "</tr></table>"
    "<p>See <a href='https://en.wikipedia.org/wiki/Loire'>the encyclopedia</a>.</p>"
)
NAV = "<nav><a href='/'>Home</a> | <a href='/about'>About us</a> | <a href='/shop'>Shop</a></nav>"
FOOTER = "<footer>Copyright 2024 Rivers Inc. <a href='/privacy'>Privacy policy</a></footer>"


def test_trafilatura_drops_the_boilerplate_that_markdown_keeps():
    html = page(
        f"{NAV}<div class='content'>{ARTICLE}</div>{FOOTER}",
        '<meta property="og:title" content="The Loire">',
    )
    markdown = read_page(html.encode(), "text/html", URL)
    extracted = read_page(html.encode(), "text/html", URL, reader="trafilatura")
    assert "About us" in markdown.text and "Privacy policy" in markdown.text
    assert "About us" not in extracted.text and "Privacy policy" not in extracted.text
    for got in (markdown, extracted):
        assert "longest river in France" in got.text and "Saint-Nazaire" in got.text
        assert "[the encyclopedia](https://en.wikipedia.org/wiki/Loire)" in got.text
        assert "| Length | 1,006 km |" in got.text.replace("  ", " ")
    assert (markdown.title, extracted.title) == ("A page", "The Loire")


def test_markdown_reads_the_main_region_and_starts_at_the_fragment():
    html = page(f"{NAV}<main>{ARTICLE}<h2 id='towns'>Towns</h2><p>Tours.</p></main>{FOOTER}")
    got = read_page(html.encode(), "text/html", URL)
    assert got.text.startswith("# The Loire") and "About us" not in got.text
    got = read_page(html.encode(), "text/html", URL, fragment="towns")
    assert got.text == "Towns\n\nTours."
    got = read_page(html.encode(), "text/html", URL, reader="trafilatura", fragment="towns")
    assert "longest river" in got.text  # trafilatura reads the whole page


def test_trafilatura_falls_back_to_markdown_when_it_finds_nothing():
    html = page("<img src='/map.png' alt='A map of the river'>")
    got = read_page(html.encode(), "text/html", URL, reader="trafilatura")
    assert (got.title, got.text) == ("A page", "![A map of the river](/map.png)")


def test_trafilatura_keeps_links_to_what_javascript_loads():
    html = page(
        f"<main>{ARTICLE}<section id='details' data-src='/rivers/api/loire.json'>"
        "<h2>Details</h2><p>Loading details...</p></section><img data-src='/lazy.png'></main>"
    )
    got = read_page(html.encode(), "text/html", URL, reader="trafilatura")
    assert got.text.endswith("\n\n[loaded by JavaScript from this source](/rivers/api/loire.json)")
    assert "lazy.png" not in got.text


def test_a_page_in_a_legacy_charset_reaches_trafilatura_decoded():
    html = page(
        f"<article>{ARTICLE}<p>{CHARSETS[0][2]}</p></article>", '<meta charset="windows-1252">'
    )
    got = read_page(html.encode("cp1252"), "text/html", URL, reader="trafilatura")
    assert CHARSETS[0][2] in got.text and got.charset == "cp1252"
