"""Reading a fetched page as text: its kind from the Content-Type (or, when the server
does not say, from its first bytes), its charset found as a browser finds it, and its
text: an HTML page as Markdown (its main region, or trafilatura's main content), a
PDF's text layer, a text page as is.

Reading is synchronous CPU work (a large PDF takes seconds): an async caller runs it in
a thread.
"""

from __future__ import annotations

import codecs
import io
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import charset_normalizer
from bs4 import BeautifulSoup
from markdownify import markdownify

if TYPE_CHECKING:
    from pypdf import PdfReader

Kind = Literal["html", "pdf", "text"]
Reader = Literal["markdown", "trafilatura"]

MAX_PDF_PAGES = 200  # a PDF's pages read; the rest are cut, and the text says so

_BLANK_LINES = re.compile(r"\n{3,}")
_ANCHOR = "\ue000anchor\ue000"


class Unreadable(Exception):
    """A page that cannot be read; the message, for the agent, says what and why."""


@dataclass(frozen=True)
class Page:
    """A page read as text."""

    title: str | None
    text: str
    kind: Kind
    charset: str | None  # the Python codec the text was decoded with; None for a PDF


def read_page(
    body: bytes,
    content_type: str | None,
    url: str,
    *,
    reader: Reader = "markdown",
    fragment: str | None = None,
) -> Page:
    """The page ``body`` fetched from ``url`` as text, or :class:`Unreadable`.

    ``reader`` chooses how an HTML page is read: ``markdown``, its main region (see
    :func:`html_to_markdown`; ``fragment`` starts the text at that element), or
    ``trafilatura``, its main content without navigation and boilerplate (``fragment``
    ignored), falling back to ``markdown`` where trafilatura finds nothing.
    """
    mime, declared = _parse_content_type(content_type)
    kind = _kind(mime, body)
    if kind == "pdf":
        title, text = _read_pdf(body)
        return Page(title, text, "pdf", None)
    text, charset = _decode(body, declared, html=kind == "html")
    if kind == "text":
        return Page(None, text, "text", charset)  # JSON as served: a copyable form
    found = _extract_main(text, url) if reader == "trafilatura" else None
    title, text = found if found is not None else html_to_markdown(text, fragment)
    return Page(title, text, "html", charset)


def html_to_markdown(html: str, fragment: str | None = None) -> tuple[str | None, str]:
    """(title, Markdown of the page's main region, or of its body when it has none).

    With a ``fragment`` naming an element id on the page, the text starts at that
    element, as a browser scrolls to it: long pages are read section by section.
    """
    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "noscript", "template"]):
        tag.decompose()
    title = soup.title.get_text(" ", strip=True) if soup.title else None
    for el in soup.find_all(attrs={"data-src": True}):  # filled by JavaScript from a source:
        link = soup.new_tag("a", href=el["data-src"])  # here, a link to read it by
        link.string = "loaded by JavaScript from this source"
        para = soup.new_tag("p")
        para.append(link)
        el.append(para)
    main = soup.find("main") or soup.find(attrs={"role": "main"}) or soup.body or soup
    target = (
        (soup.find(id=fragment) or soup.find("a", attrs={"name": fragment})) if fragment else None
    )
    if target is not None:
        target.insert(0, _ANCHOR)
        if main is not soup and _ANCHOR not in str(main):
            main = soup.body or soup  # the anchor lies outside the main region
    text = markdownify(
        str(main), heading_style="ATX", bullets="-",
        escape_underscores=False, escape_asterisks=False, escape_misc=False,
    )  # fmt: skip
    if target is not None and _ANCHOR in text:
        text = text[text.index(_ANCHOR) + len(_ANCHOR) :]
    return title, _BLANK_LINES.sub("\n\n", text).strip()


# --- kind ---------------------------------------------------------------------------

_HTML_TYPES = {"text/html", "application/xhtml+xml"}
_PDF_TYPES = {"application/pdf", "application/x-pdf"}
_TEXT_TYPES = {"application/json", "application/xml"}  # and text/*, *+json, *+xml
# Types that say nothing of the content (S3's default, "download this"): sniffed.
_UNKNOWN_TYPES = {
    "", "application/octet-stream", "binary/octet-stream", "application/unknown",
    "unknown/unknown", "application/download", "application/x-download",
    "application/force-download",
}  # fmt: skip
# The WHATWG MIME Sniffing Standard's HTML signatures, each ending in a space or ">".
_HTML_START = re.compile(
    r"<(?:!doctype\s+html|html|head|body|script|iframe|h1|div|font|table|a|style|title|b|br|p"
    r"|!--)[\s>]",
    re.IGNORECASE,
)
_BINARY_BYTES = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")  # never in a text file
_BOMS = (  # UTF-32 first: its little-endian BOM starts with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def _parse_content_type(content_type: str | None) -> tuple[str, str | None]:
    """(MIME type in lower case, charset parameter or None) of a Content-Type header."""
    mime, _, params = (content_type or "").partition(";")
    charset = None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip("\"'")
    return mime.strip().lower(), charset


def _kind(mime: str, body: bytes) -> Kind:
    """The kind of a page by its MIME type, by its first bytes when the type says nothing
    of it; a PDF is read as one whatever its type says (servers mislabel them)."""
    if body.startswith(b"%PDF-") or mime in _PDF_TYPES:
        return "pdf"
    if mime in _HTML_TYPES:
        return "html"
    if mime in _TEXT_TYPES or mime.startswith("text/") or mime.endswith(("+json", "+xml")):
        return "text"
    if mime in _UNKNOWN_TYPES:
        if (kind := _sniff(body)) is not None:
            return kind
        raise Unreadable(
            f"cannot read a page of type {mime or 'unknown'}: its content is not HTML, PDF or text"
        )
    raise Unreadable(f"cannot read a page of type {mime}: only HTML, PDF and text pages are read")


def _sniff(body: bytes) -> Kind | None:
    """The kind of a page of unknown type from its first bytes, as browsers sniff one
    (WHATWG MIME Sniffing): HTML by its opening tag, PDF by its header, text when it
    holds no bytes that a text file never has (or starts with a BOM)."""
    head = body[:1024]
    for bom, codec in _BOMS:
        if head.startswith(bom):
            start = head[len(bom) :].decode(codec, "ignore").lstrip()
            return "html" if _HTML_START.match(start) else "text"
    if _HTML_START.match(head.decode("latin-1").lstrip()):
        return "html"
    if b"%PDF-" in head:  # Acrobat accepts a header anywhere in the first KB
        return "pdf"
    return "text" if head and _BINARY_BYTES.search(head) is None else None


# --- charset ------------------------------------------------------------------------

# Labels that browsers decode with another codec than Python's of the same name (WHATWG
# Encoding Standard): Latin-1 and ASCII as windows-1252, GB2312 and GBK as GB18030,
# Shift_JIS and EUC-KR as Microsoft's supersets, UTF-16 without a BOM as little-endian;
# and labels Python does not know. Python's own names for those codecs are labels too.
_WHATWG_CODECS = {
    "cp1252": "ascii us-ascii ansi_x3.4-1968 iso-8859-1 iso8859-1 iso_8859-1 iso_8859-1:1987 "
    "latin1 latin-1 l1 cp819 ibm819 iso-ir-100 csisolatin1 x-cp1252",
    "gb18030": "gb2312 gb_2312 gb_2312-80 gbk x-gbk chinese csgb2312 csiso58gb231280 iso-ir-58 "
    "cp936 ms936 windows-936",
    "cp932": "shift_jis shift-jis sjis x-sjis ms_kanji ms932 windows-31j csshiftjis",
    "cp949": "euc-kr euc_kr ks_c_5601-1987 ks_c_5601-1989 ksc5601 ksc_5601 korean cseuckr "
    "csksc56011987 iso-ir-149 windows-949",
    "cp1254": "iso-8859-9 iso8859-9 iso_8859-9 latin5 l5 csisolatin5",
    "cp874": "tis-620 iso-8859-11 windows-874 dos-874",
    "big5hkscs": "big5 big5-hkscs cn-big5 csbig5 x-x-big5",
    "utf-16-le": "utf-16 utf-16le unicode ucs-2 csunicode iso-10646-ucs-2 unicodefeff",
    "utf-16-be": "utf-16be unicodefffe",
    "utf-8": "unicode-1-1-utf-8 unicode11utf8 unicode20utf8 x-unicode20utf8",
    "iso8859-8": "iso-8859-8-i csiso88598i logical",
    "koi8-u": "koi8-ru",
    "mac-cyrillic": "x-mac-cyrillic x-mac-ukrainian",
    "mac-roman": "macintosh mac x-mac-roman csmacintosh",
}
_CODEC_OF_LABEL = {label: c for c, labels in _WHATWG_CODECS.items() for label in labels.split()}
# The codecs browsers decode (the Encoding Standard's, by Python's names): a detected
# charset outside them is a guess that no page on the web is written in.
_BROWSER_CODECS = {
    "utf-8", "utf-16-le", "utf-16-be", "cp866", "iso8859-2", "iso8859-3", "iso8859-4",
    "iso8859-5", "iso8859-6", "iso8859-7", "iso8859-8", "iso8859-10", "iso8859-13",
    "iso8859-14", "iso8859-15", "iso8859-16", "koi8-r", "koi8-u", "mac-roman", "mac-cyrillic",
    "cp874", "cp1250", "cp1251", "cp1252", "cp1253", "cp1254", "cp1255", "cp1256", "cp1257",
    "cp1258", "gb18030", "big5hkscs", "euc_jp", "iso2022_jp", "cp932", "cp949",
}  # fmt: skip
# Text codecs that are no page's charset: they never decode, or read escapes and markup.
_NOT_CHARSETS = {"undefined", "unicode-escape", "raw-unicode-escape", "idna", "punycode", "utf-7"}
_META_CHARSET = re.compile(rb"<meta\s[^>]*?charset\s*=\s*[\"']?\s*([\w.:+-]+)", re.IGNORECASE)
_COMMENT = re.compile(rb"<!--.*?-->", re.DOTALL)
_NON_ASCII = bytes(range(128, 256))


def _codec_of(label: str | None) -> str | None:
    """The Python codec that decodes a charset label as browsers do; None if unknown."""
    if not label:
        return None
    label = label.strip().strip("\"'").lower()
    try:
        name = codecs.lookup(_CODEC_OF_LABEL.get(label, label)).name
        name = _CODEC_OF_LABEL.get(name, name)
        if name in _NOT_CHARSETS:
            return None
        b"a".decode(name, "ignore")  # LookupError for a bytes-to-bytes codec (base64, ...)
    except LookupError:
        return None
    return name


def _decode(body: bytes, declared: str | None, *, html: bool) -> tuple[str, str]:
    """(text, codec) of a page's bytes, errors replaced, its charset found as browsers do.

    A BOM decides; else UTF-8 when the bytes are valid UTF-8 and not all ASCII (text in
    another charset is almost never valid UTF-8, while pages sent as Latin-1 or Shift_JIS
    that are in fact UTF-8 are common); else the charset that the Content-Type declares,
    else (HTML) one that a ``<meta>`` in the first 4 KB declares; else one detected by
    charset_normalizer; failing all, UTF-8.

    A declared charset is used unless it does not fit: more than 1 in 50 of the body's
    non-ASCII bytes fail to decode in it; then UTF-8 is tried the same way, then the
    charset is detected. A few failures do not count, so that one stray byte in a long
    page does not throw its charset away (nor make a UTF-8 page look like cp1250 to the
    detector). A wrong single-byte charset (a page in koi8-r sent as windows-1251) decodes
    any bytes and so goes unseen.
    """
    for bom, codec in _BOMS:
        if body.startswith(bom):
            return body[len(bom) :].decode(codec, "replace"), codec
    non_ascii = len(body) - len(body.translate(None, _NON_ASCII))
    if non_ascii and _is_utf8(body):
        return body.decode("utf-8", "replace"), "utf-8"  # (replace: a cut last character)
    candidates = [_codec_of(declared), _meta_charset(body) if html else None]
    declared_codecs = [c for c in candidates if c is not None]
    for codec in [*declared_codecs, "utf-8"]:  # UTF-8 with a few stray bytes, too
        text = body.decode(codec, "replace")
        if text.count("\ufffd") * 50 <= non_ascii:
            return text, codec
    codec = _detect(body) or (declared_codecs or ["utf-8"])[0]
    return body.decode(codec, "replace"), codec


def _is_utf8(body: bytes) -> bool:
    """Whether the bytes are valid UTF-8, a body cut short inside a character included."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(body, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _meta_charset(body: bytes) -> str | None:
    """The charset that a ``<meta charset>`` or ``<meta http-equiv="Content-Type">`` in
    the first 4 KB declares (as the HTML spec's prescan finds it), comments skipped."""
    match = _META_CHARSET.search(_COMMENT.sub(b"", body[:4096]))
    codec = _codec_of(match.group(1).decode("ascii")) if match else None
    if codec is not None and codec.startswith(("utf-16", "utf-32")):
        return "utf-8"  # the meta was read as ASCII, so the page is not UTF-16 (the spec)
    return codec


def _detect(body: bytes) -> str | None:
    """The charset of bytes that are not UTF-8: charset_normalizer's best guess among
    the codecs browsers decode. windows-1252, the web's most common legacy charset, wins
    over a guess that is barely better: in French text, cp1257 and cp1250 differ from it
    on a few letters only, and charset_normalizer's scores hardly tell them apart."""
    guesses = [
        (_codec_of(r.encoding), r.chaos, r.coherence) for r in charset_normalizer.from_bytes(body)
    ]
    guesses = [g for g in guesses if g[0] in _BROWSER_CODECS]
    if not guesses:
        return None
    _, chaos, coherence = guesses[0]  # the best first
    for codec, cp_chaos, cp_coherence in guesses:
        if codec == "cp1252" and cp_chaos <= chaos + 0.1 and cp_coherence >= coherence:
            return codec
    return guesses[0][0]


# --- readers ------------------------------------------------------------------------


def _extract_main(html: str, url: str) -> tuple[str | None, str] | None:
    """(title, Markdown of the page's main content) by trafilatura; None if it finds none.

    Sections that JavaScript fills from a ``data-src`` get links to their sources after
    the text, as :func:`html_to_markdown` gives them in place.
    """
    import trafilatura  # here: an import of ~0.1 s that the markdown reader never needs

    text = trafilatura.extract(
        html, url=url, output_format="markdown", include_links=True, include_tables=True,
        favor_recall=True,
    )  # fmt: skip
    if not text or not text.strip():
        return None
    tree = trafilatura.load_html(html)
    if tree is None:
        return None, text.strip()
    sources = tree.xpath(
        "//*[@data-src][not(self::img or self::iframe or self::video or self::audio"
        " or self::source or self::picture or self::embed)]/@data-src"
    )
    title = trafilatura.extract_metadata(tree, default_url=url, extensive=False).title
    title = title or (tree.findtext(".//title") or "").strip() or None
    links = "".join(f"\n\n[loaded by JavaScript from this source]({src})" for src in sources)
    return title, text.strip() + links


def _read_pdf(body: bytes) -> tuple[str | None, str]:
    """(title, text) of a PDF: each page's text layer, the first MAX_PDF_PAGES pages."""
    from pypdf import PdfReader  # here: only PDFs need it
    from pypdf.errors import DependencyError

    try:
        pdf = PdfReader(io.BytesIO(body))
        if pdf.is_encrypted and not pdf.decrypt(""):
            raise Unreadable("cannot read this PDF: it is protected by a password")
        n = len(pdf.pages)
        texts = [_pdf_page_text(pdf, i) for i in range(min(n, MAX_PDF_PAGES))]
        title = pdf.metadata.title if pdf.metadata else None
    except Unreadable:
        raise
    except DependencyError as e:  # AES needs the cryptography package
        raise Unreadable("cannot read this PDF: its encryption cannot be undone here") from e
    except Exception as e:  # a broken file raises anything from deep in the parser
        raise Unreadable(f"cannot read this PDF: it is damaged ({_reason(e)})") from e
    if n == 0:
        raise Unreadable("cannot read this PDF: it has no pages")
    if not any(texts):
        raise Unreadable("cannot read this PDF: it has no text layer (a scan?)")
    text = texts[0] + "".join(f"\n\n--- page {i} ---\n\n{t}" for i, t in enumerate(texts[1:], 2))
    if n > MAX_PDF_PAGES:
        text += f"\n\n--- cut: the PDF has {n} pages; only the first {MAX_PDF_PAGES} were read ---"
    title = title.strip() if isinstance(title, str) else None
    return title or None, _BLANK_LINES.sub("\n\n", text)


def _pdf_page_text(pdf: PdfReader, i: int) -> str:
    """The text layer of page i; a note in its place when that page alone is damaged."""
    from pypdf.errors import DependencyError

    try:
        return pdf.pages[i].extract_text().strip()
    except DependencyError:
        raise
    except Exception as e:
        return f"[this page could not be read: {_reason(e)}]"


def _reason(e: Exception) -> str:
    """An exception in a few words, for the agent."""
    return str(e)[:200] or type(e).__name__
