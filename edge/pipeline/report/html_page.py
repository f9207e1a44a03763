"""report.html: one self-contained page (inline CSS; the chart and the analysis heatmaps as PNG data URIs)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from edge.pipeline import device_report
from edge.pipeline.layout import VARIANT_STEPS
from edge.pipeline.report.chart import speed_chart_png
from edge.pipeline.report.conditions import conditions
from edge.pipeline.report.model import STORY_KEYS
from edge.pipeline.report.story import story, story_after
from edge.pipeline.report.tables import COLUMNS, table_rows


def _html_inline(text: str) -> str:
    """Markdown's `code` and **bold** of a story line, escaped."""
    import re

    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


def _html_section(section) -> str:
    title, lines, tables = section
    parts = [f"<h2>{html.escape(title)}</h2>"] + [f"<p>{_html_inline(line)}</p>" for line in lines]
    for head, rows in tables:
        parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
                     + "".join("<tr>" + "".join(f'<td class="text">{html.escape(str(c))}</td>' for c in row) + "</tr>"
                               for row in rows) + "</table>")
    return "\n".join(parts)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.text { text-align: left; font-family: monospace; }
tr.pareto td { background: #fdeeee; }
ul.conditions li { margin: 0.2em 0; font-size: 0.9em; }
figure { display: inline-block; margin: 0.5em; } figure img { max-width: 560px; border: 1px solid #ddd; }
figcaption { font-size: 0.8em; color: #555; }
"""


def _shared_step(summary: dict) -> str:
    return f"{summary['status']} ({summary['work_seconds']:.1f} s)"


def _img(png: bytes, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def html_report(report: dict, out: Path) -> str:
    report = {**STORY_KEYS, **report}
    esc = html.escape
    text_columns = {COLUMNS.index(c) for c in ("variant", "plan", "test images", "vs reference", "steps")}
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = []
    for v, row in zip(report["variants"], table_rows(report)):
        cells = "".join(f'<td class="text">{esc(c)}</td>' if i in text_columns else f"<td>{esc(c)}</td>"
                        for i, c in enumerate(row))
        body.append(f'<tr class="pareto">{cells}</tr>' if v["pareto"] else f"<tr>{cells}</tr>")
    steps_head = "".join(f"<th>{esc(s)}</th>" for s in VARIANT_STEPS)
    steps_rows = []
    for v in report["variants"]:
        cells = "".join("<td>-</td>" if s not in v["steps"] else
                        f"<td>{esc(v['steps'][s]['status'])} ({v['steps'][s]['work_seconds']:.1f} s)</td>"
                        for s in VARIANT_STEPS)
        steps_rows.append(f'<tr><td class="text">{esc(v["name"])}</td>{cells}</tr>')
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>edge pipeline report: {esc(report['recipe']['model'])}</title>", f"<style>{CSS}</style></head><body>",
        "<h1>edge pipeline report</h1>",
        f"<p>Created {esc(report['created'])} by edge {esc(report['edge'])}.</p>",
        *[_html_section(section) for section in story(report)],
        "<h2>Accuracy and speed</h2>", f"<table><tr>{head}</tr>{''.join(body)}</table>",
        "<p>Rows in red are on the Pareto front (lower median latency, higher accuracy).</p>",
        _img(speed_chart_png(report), "accuracy vs speedup over the original: measured here (circles, 95 % "
                                      "interval) and estimated for the Orin Nano (diamonds)"),
        *[_html_section(section) for section in story_after(report)],
        "<h2>How it was measured</h2>",
        '<ul class="conditions">' + "".join(f"<li>{esc(c)}</li>" for c in conditions(report)) + "</ul>",
    ]
    analysis = report["analysis"]
    if analysis:
        parts.append("<h2>Analysis of the original model</h2>")
        parts.append(f"<p>{analysis['samples']} calibration images of {esc(analysis['data'])}; most redundant block "
                     f"(highest Block Redundancy): {analysis['most_redundant_block']}.</p>")
        for name, path in analysis["pictures"].items():
            parts.append(_img((out / path).read_bytes(), name.replace("_", " ")))
    parts += ["<h2>Steps this run</h2>", f'<table><tr><th>variant</th>{steps_head}</tr>{"".join(steps_rows)}</table>',
              "<p>profile (all variants side by side): "
              f"{esc(_shared_step(report['latency']['steps']['profile']))}.</p>",
              "<p>ran: done in this run; cached: its inputs (content hashes) did not change, so it was not redone. "
              "Seconds: the wall time of the work when it ran.</p>"]
    if report.get("device"):
        parts.append(device_report.device_html(report["device"]))
    parts += ["</body></html>", ""]
    return "\n".join(parts)
