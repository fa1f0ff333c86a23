"""The HTML pieces of the report: escaping, tables, figures, headings with a table of contents, the style sheet.

Every string that comes from a record or a file goes through :func:`esc` (or a table cell, which escapes it);
only :class:`Html` values, built here from escaped parts, are written as they are.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dtpo.core.measurement import Measurement
from dtpo.telemetry.report.svg import inline_svg
from dtpo.telemetry.summary import format_value


class Html(str):
    """Markup that is already safe: written into the page as it is (what is added to it is escaped)."""

    def __add__(self, other: str) -> Html:
        return Html(str.__add__(self, esc(other)))


def esc(value: Any) -> Html:
    """``value`` as text, HTML-escaped (quotes included)."""
    return value if isinstance(value, Html) else Html(html.escape(str(value), quote=True))


def join(parts: Iterable[str]) -> Html:
    """Safe parts put together (plain strings among them are escaped)."""
    return Html("".join(esc(p) for p in parts))


def tag(name: str, content: Any = "", **attrs: Any) -> Html:
    """``<name attrs>content</name>``; ``content`` escaped unless it is :class:`Html`; ``class_`` for ``class``."""
    text = "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items() if v is not None)
    return Html(f"<{name}{text}>{esc(content)}</{name}>")


def para(text: Any, class_: str | None = None) -> Html:
    """A paragraph."""
    return tag("p", text, class_=class_)


def badge(text: str, kind: str) -> Html:
    """A small label: ``est`` (estimated), ``sim`` (simulated), ``ok``, ``bad``."""
    return tag("span", text, class_=f"badge {kind}")


def table(headers: Sequence[Any], rows: Iterable[Sequence[Any]], class_: str | None = None) -> Html:
    """A table; cells are escaped unless :class:`Html`, numbers right-aligned by the style sheet."""
    head = join(tag("th", h) for h in headers)
    body = join(tag("tr", join(tag("td", c) for c in row)) for row in rows)
    return tag("table", Html(f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody>"), class_=class_)


def figure(fig_id: str, svg: str, caption: Any) -> Html:
    """An inline SVG figure with its caption, in ``<figure id=fig_id>`` (its SVG's ids prefixed by ``fig_id``)."""
    return Html(f'<figure id="{esc(fig_id)}" class="plot">{inline_svg(svg, fig_id)}'
                f"<figcaption>{esc(caption)}</figcaption></figure>")


def measurement_cells(m: Measurement | dict[str, Any] | None) -> tuple[Html, Html, Html]:
    """Value with unit, source (``estimated`` flagged), note: three table cells."""
    if isinstance(m, dict):
        m = Measurement.from_dict(m)
    if m is None:
        return esc("n/a"), esc(""), esc("")
    value = format_value(Measurement(m.value, m.unit)) if m.value is not None else "n/a"
    source = badge("estimated", "est") if m.estimated else esc(m.source)
    return esc(value), source, esc(m.note)


def short_value(m: Measurement | dict[str, Any] | None) -> Html:
    """A measurement in one cell: value and unit, ``estimated`` flagged."""
    value, _, _ = measurement_cells(m)
    estimated = m is not None and (m.estimated if isinstance(m, Measurement) else m.get("source") == "estimated")
    return join([value, " ", badge("estimated", "est")]) if estimated else value


def flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as ``(dotted.key, value)`` rows; lists and scalars as compact JSON."""
    if isinstance(data, dict) and data:
        rows: list[tuple[str, str]] = []
        for key, value in data.items():
            rows += flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return rows
    if isinstance(data, float):
        return [(prefix, f"{data:.6g}")]
    text = data if isinstance(data, str) else json.dumps(data, default=str)
    return [(prefix, text)]


@dataclass
class Page:
    """Collects headings as they are written, for the table of contents.

    Attributes:
        toc: ``(level, id, title)`` per heading, in page order.
        ids: Every id handed out, so none is given twice.
    """

    toc: list[tuple[int, str, str]] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)

    def unique(self, wanted: str) -> str:
        """``wanted``, or ``wanted-2``, ``wanted-3``, ... if it is taken."""
        candidate, n = wanted, 1
        while candidate in self.ids:
            n += 1
            candidate = f"{wanted}-{n}"
        self.ids.add(candidate)
        return candidate

    def heading(self, level: int, sid: str, title: str, extra: Html | None = None) -> Html:
        """``<hN id=sid>title</hN>`` (plus ``extra`` markup after the title), listed in the contents."""
        self.toc.append((level, sid, title))
        return Html(f'<h{level} id="{esc(sid)}">{esc(title)}{" " + extra if extra else ""}</h{level}>')

    def contents(self, deepest: int = 3) -> Html:
        """The table of contents as nested lists."""
        out, depth = [], 1
        for level, sid, title in self.toc:
            if level > deepest:
                continue
            while depth < level:
                out.append("<ul>")
                depth += 1
            while depth > level:
                out.append("</ul>")
                depth -= 1
            out.append(f'<li><a href="#{esc(sid)}">{esc(title)}</a></li>')
        out += ["</ul>"] * (depth - 1)
        return Html(f'<nav class="toc"><h2>Contents</h2><ul>{"".join(out)}</ul></nav>')


CSS = """
:root { --ink: #1d232b; --muted: #5b6572; --line: #d9dee5; --bg: #ffffff; --panel: #f6f8fa; --link: #0b5cad; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 32px 48px; }
header.top { border-bottom: 3px solid #0072B2; margin-bottom: 16px; padding-bottom: 8px; }
h1 { font-size: 28px; margin: 0 0 4px; }
h2 { font-size: 22px; margin: 40px 0 8px; padding-top: 8px; border-top: 1px solid var(--line); }
h3 { font-size: 18px; margin: 28px 0 8px; }
h4 { font-size: 16px; margin: 20px 0 6px; }
p { margin: 6px 0; }
.muted, figcaption, .absent { color: var(--muted); }
.absent { font-style: italic; }
a { color: var(--link); text-decoration: none; }
a:hover { text-decoration: underline; }
nav.toc { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 8px 20px;
  margin: 16px 0; }
nav.toc h2 { font-size: 16px; margin: 4px 0; border: 0; padding: 0; }
nav.toc ul { margin: 2px 0; padding-left: 20px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13.5px; display: block; max-width: 100%;
  overflow-x: auto; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td:not(:first-child) { font-variant-numeric: tabular-nums; }
table.figures td:not(:last-child), table.overview td { white-space: nowrap; }
table.kv td:first-child { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px;
  color: var(--muted); }
table.kv td { max-width: 620px; word-break: break-word; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(440px, 1fr)); gap: 0 24px; }
figure.plot { margin: 12px 0 20px; padding: 8px; border: 1px solid var(--line); border-radius: 6px;
  background: #fff; }
figure.plot svg { display: block; width: 100%; height: auto; }
figcaption { font-size: 13px; margin-top: 4px; }
.badge { display: inline-block; font-size: 11.5px; font-weight: 600; padding: 1px 7px; border-radius: 9px;
  vertical-align: middle; white-space: nowrap; }
.badge.est { background: #fdebd0; color: #8a4b00; border: 1px solid #e6a55a; }
.badge.sim { background: #e8e0f0; color: #5a2d82; border: 1px solid #b79ad3; }
.badge.ok { background: #d9f0e6; color: #0b5e3f; border: 1px solid #7cc4a5; }
.badge.bad { background: #f8dcd5; color: #8c2a0c; border: 1px solid #e39a84; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--link); }
ul.plain { margin: 4px 0; padding-left: 20px; }
footer { margin-top: 48px; padding-top: 12px; border-top: 3px solid var(--line); font-size: 13.5px;
  color: var(--muted); }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
"""
