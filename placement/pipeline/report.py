"""``placectl pipeline report``: an export directory -> report.html, report.json, plots.

Reading and drawing only; the numbers come from :mod:`placement.pipeline.history` and
:mod:`placement.pipeline.analytics`. The HTML is self-contained (every PNG embedded as base64)
and the PNGs are also written as files under ``plots/``. The local engine reads the export here
(:func:`build_report`); the Spark engine's numbers come from
:mod:`placement.pipeline.spark_report`, and both are written by :func:`write_report`.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from placement.errors import InvalidInput
from placement.pipeline.analytics import (
    ReportInput,
    ZoneStats,
    done_durations,
    numbers_json,
    zone_stats,
)
from placement.pipeline.history import (
    Event,
    Rebalance,
    SkewPoint,
    event_of,
    node_load,
    rebalances,
    skew_over_time,
    stable_at_start,
)
from placement.pipeline.inputs import read_partition_sizes, read_table
from placement.pipeline.outputs import atomic_directory

PLOTS = {
    "load": "load_before_after.png",
    "moves": "moves_per_zone.png",
    "bytes": "bytes_per_zone.png",
    "durations": "duration_distribution.png",
    "skew": "skew_over_time.png",
}


#: The tables a report reads (sizes.parquet too, when present).
REQUIRED = ("history", "assignments")
_FIX_EXPORT = "pass a directory written by `placectl pipeline export`"


def check_export(directory: Path) -> None:
    """Raises InvalidInput (``--input``) unless ``directory`` holds the tables a report reads."""
    if not directory.is_dir():
        raise InvalidInput("--input", f"{directory} is not a directory", _FIX_EXPORT)
    for name in REQUIRED:
        if not (directory / f"{name}.parquet").exists():
            raise InvalidInput("--input", f"{directory} has no {name}.parquet", _FIX_EXPORT)


def read_history(directory: Path) -> tuple[list[Event], dict[tuple[str, int], tuple[str, ...]]]:
    """History events and the current stable assignment of an export directory."""
    events = [event_of(r) for r in read_table(directory, "history").to_pylist()]
    current = {
        (str(r["zone"]), int(r["partition"])): tuple(r["peers"])
        for r in read_table(
            directory, "assignments", ["zone", "partition", "field", "peers"]
        ).to_pylist()
        if r["field"] == "stable" and r["peers"] is not None
    }
    return events, current


def _meta(directory: Path) -> dict[str, Any]:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _bar(
    labels: Sequence[str], series: Mapping[str, Sequence[float]], title: str, ylabel: str
) -> bytes:
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(labels) + 2), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, rotation=90 if len(labels) > 8 else 0, fontsize=7)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend()
    return _png(fig)


def plots(
    stats: Mapping[str, ZoneStats],
    durations: Sequence[float],
    before: Mapping[str, int],
    after: Mapping[str, int],
    skew: Sequence[SkewPoint],
) -> dict[str, bytes]:
    nodes = sorted(set(before) | set(after))
    zones = list(stats)
    out = {
        "load": _bar(
            nodes,
            {
                "before (history start)": [before.get(n, 0) for n in nodes],
                "after (now)": [after.get(n, 0) for n in nodes],
            },
            "Replicas per node",
            "replicas",
        ),
        "moves": _bar(
            zones,
            {
                "done": [stats[z].moves_done for z in zones],
                "in progress": [stats[z].moves_in_progress for z in zones],
            },
            "Moves (new replicas) per zone",
            "moves",
        ),
        "bytes": _bar(
            zones,
            {
                "moved": [stats[z].bytes_moved for z in zones],
                "to move (in progress)": [stats[z].bytes_to_move for z in zones],
            },
            "Bytes moved / to move per zone",
            "bytes",
        ),
    }
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(durations, bins=min(30, max(1, len(durations))))
    ax.set_title("Rebalance durations (pending written -> stable switched)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("rebalances")
    out["durations"] = _png(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.step([p.revision for p in skew], [p.spread for p in skew], where="post")
    ax.set_title("Fleet node-load spread (max - min replicas) over time")
    ax.set_xlabel("etcd revision")
    ax.set_ylabel("spread")
    out["skew"] = _png(fig)
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def render_html(numbers: Mapping[str, Any], images: Mapping[str, bytes]) -> str:
    totals = numbers["totals"]
    zone_rows = [
        [
            name,
            z["rebalances"],
            ", ".join(f"{k} {v}" for k, v in z["outcomes"].items()),
            z["moves"],
            z["bytes_moved"],
            z["bytes_to_move"],
            z["duration_s"]["median"],
            z["duration_s"]["max"],
        ]
        for name, z in numbers["zones"].items()
    ]
    figures = "".join(
        f'<figure><img alt="{key}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{html.escape(PLOTS[key])}</figcaption></figure>"
        for key, png in images.items()
    )
    history = numbers["history"]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Rebalance report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}img{{max-width:100%}}</style>
</head><body>
<h1>Rebalance report</h1>
<p>History revisions {history.get("history_from", "?")}..{history.get("history_to", "?")},
snapshot revision {history.get("revision", "?")}.</p>
{_table(list(totals), [[*list(totals.values())[:-1], totals["duration_s"]["median"]]])}
<h2>Per zone</h2>
{
        _table(
            [
                "zone",
                "rebalances",
                "outcomes",
                "moves",
                "bytes moved",
                "bytes to move",
                "median s",
                "max s",
            ],
            zone_rows,
        )
    }
<h2>Plots</h2>
{figures}
</body></html>
"""


def _write_rebalances(path: Path, items: Iterable[Rebalance]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["zone", "partition", "outcome", "start_revision", "end_revision", "start_ts",
             "end_ts", "duration_s", "moves", "old", "new"]
        )  # fmt: skip
        for r in items:
            writer.writerow(
                [r.zone, r.partition, r.outcome, r.start_revision, r.end_revision, r.start_ts,
                 r.end_ts, r.duration_s, r.moves, " ".join(r.old or ()), " ".join(r.new)]
            )  # fmt: skip


def build_report(directory: Path, out: Path) -> dict[str, Any]:
    """Reads the export, computes the numbers, writes the report directory atomically (the
    local engine)."""
    check_export(directory)
    events, current = read_history(directory)
    sizes_by_zone = read_partition_sizes(directory)
    sizes = {(z, p): s.bytes for z, parts in sizes_by_zone.items() for p, s in parts.items()}
    start = stable_at_start(events, current)
    items = rebalances(events, start)
    return write_report(
        ReportInput(
            stats=zone_stats(items, sizes),
            rebalances=len(items),
            durations=done_durations(items),
            meta=_meta(directory),
            load_before=node_load(start.values()),
            load_after=node_load(current.values()),
            skew=skew_over_time(events, start),
            rows=lambda: items,
        ),
        out,
    )


def write_report(data: ReportInput, out: Path) -> dict[str, Any]:
    """Writes the report directory atomically from either engine's numbers; returns the totals."""
    numbers = numbers_json(data.stats, data.rebalances, data.durations, data.meta)
    before, after = dict(data.load_before), dict(data.load_after)
    numbers["load_before"], numbers["load_after"] = before, after
    numbers["skew"] = [_skew(p) for p in data.skew]
    images = plots(data.stats, data.durations, before, after, data.skew)
    with atomic_directory(out, "--out") as tmp:
        (tmp / "plots").mkdir()
        for key, png in images.items():
            (tmp / "plots" / PLOTS[key]).write_bytes(png)
        (tmp / "report.json").write_text(json.dumps(numbers, indent=1) + "\n")
        (tmp / "report.html").write_text(render_html(numbers, images))
        _write_rebalances(tmp / "rebalances.csv", data.rows())
    return {**numbers["totals"]}


def _skew(p: SkewPoint) -> dict[str, Any]:
    return {
        "revision": p.revision,
        "ts": p.ts,
        "spread": p.spread,
        "max": p.max_load,
        "min": p.min_load,
    }
