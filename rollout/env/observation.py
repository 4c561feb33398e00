"""What the agent sees after each action, and the one renderer that turns it into text.

The model reads :func:`render`'s output, the progress tracker logs the same
string, and the episode record stores it: there is one text per observation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Observation:
    text: str  # the page's readable text, search results, or a message
    url: str | None = None  # where the browser (or fetcher) is now
    title: str | None = None
    error: str | None = None  # what went wrong with the last action, in words for the agent
    note: str = ""  # a remark from the parser (e.g. that further actions were ignored)
    summary: str = ""  # one line for the progress log
    screenshot: bytes | None = None  # an image (env.screenshot_format), when one was taken
    page_text: str | None = None  # the full page text the observation was cut from
    # som: the numbered elements as data for tools and the dashboard (id, role, name,
    # value, states, tag, and the box x/y/w/h in viewport pixels)
    elements: tuple[dict, ...] = ()


@dataclass(frozen=True)
class ScreenshotOptions:
    """How a browser backend encodes its screenshots (env.screenshot_*)."""

    format: str = "png"  # png | jpeg | webp
    quality: int = 80  # jpeg and webp
    fast: bool = True  # Chromium's optimizeForSpeed


_MAGIC = ((b"\x89PNG", "png"), (b"\xff\xd8\xff", "jpeg"), (b"RIFF", "webp"))


def image_type(data: bytes) -> str:
    """``png``, ``jpeg`` or ``webp``, from an image's first bytes (what a screenshot is
    depends on env.screenshot_format); ``png`` for anything else."""
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    return "png"


def truncate(text: str, budget: int) -> str:
    """``text`` cut to ``budget`` characters with a visible marker saying how much was cut."""
    if len(text) <= budget:
        return text
    cut = text[:budget]
    if "\n" in cut[budget // 2 :]:  # end on a line break when one is near the end
        cut = cut[: cut.rindex("\n")]
    return f"{cut}\n[... truncated: {len(text) - len(cut)} more characters]"


def render(obs: Observation, budget: int) -> str:
    """The text the model reads: location, then content within ``budget``, then any error."""
    lines = []
    if obs.url:
        lines.append(f"URL: {obs.url}")
    if obs.title:
        lines.append(f"Title: {obs.title}")
    if obs.error:
        lines.append(f"Error: {obs.error}")
    if obs.note:
        lines.append(f"Note: {obs.note}")
    if obs.screenshot is not None:
        kind = image_type(obs.screenshot).upper()
        lines.append(f"[screenshot: {len(obs.screenshot)} bytes {kind}]")
    if obs.text:
        if lines:
            lines.append("")
        lines.append(truncate(obs.text, budget))
    return "\n".join(lines)
