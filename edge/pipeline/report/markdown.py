"""report.md: the story, the variants table, how it was measured, the analysis and the device section."""

from __future__ import annotations

from edge.pipeline import device_report
from edge.pipeline.report.conditions import conditions
from edge.pipeline.report.model import STORY_KEYS
from edge.pipeline.report.story import story, story_after
from edge.pipeline.report.tables import COLUMNS, table_rows


def markdown(report: dict) -> str:
    report = {**STORY_KEYS, **report}
    lines = ["# edge pipeline report", "", f"Created {report['created']} by edge {report['edge']}."]
    for section in story(report):
        lines += _md_section(section)
    lines += ["", "## Accuracy and speed", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table_rows(report)]
    lines += ["", f"Pareto front (lower median latency, higher accuracy): {', '.join(report['pareto_front'])}. "
              "report.html plots accuracy against speedup, measured here and estimated for the Orin Nano."]
    for section in story_after(report):
        lines += _md_section(section)
    lines += ["## How it was measured", ""]
    lines += [f"- {c}" for c in conditions(report)]
    analysis = report["analysis"]
    if analysis:
        lines += ["", "## Analysis of the original model", "",
                  f"{analysis['samples']} calibration images of `{analysis['data']}`; most redundant block (highest "
                  f"Block Redundancy): {analysis['most_redundant_block']}. Heatmaps: "
                  + ", ".join(f"[{k}]({v})" for k, v in analysis["pictures"].items()) + "."]
    lines += ["", "report.html has the accuracy-vs-speed chart and the heatmaps; report.json has every figure.", ""]
    if report.get("device"):
        lines += device_report.device_markdown(report["device"])
    return "\n".join(lines)


def _md_section(section) -> list[str]:
    title, lines, tables = section
    out = ["", f"## {title}", ""]
    for line in lines:
        out += [line, ""]
    for head, rows in tables:
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
        out.append("")
    return out
