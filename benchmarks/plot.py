"""Draw the throughput plot of a harness run: ``python plot.py results.json out.png``.

Runs in the harness's plotting environment (matplotlib), not in durq's."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"sqlite": "#6c8ebf", "redis": "#d6452f", "postgresql": "#336791"}


def main() -> None:
    data = json.load(open(sys.argv[1]))
    rows = [r for r in data["results"] if r.get("process_per_s")]
    rows.sort(key=lambda r: (r["broker"], -r["process_per_s"]))
    labels = [f"{r['system']}\n({r['broker']})" for r in rows]
    metrics = [
        ("process_per_s", "processing (tasks/s, 1 worker process)"),
        ("enqueue_per_s", "enqueue one-by-one (tasks/s)"),
        ("enqueue_bulk_per_s", "enqueue bulk (tasks/s)"),
    ]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(8, len(rows) * 0.9), 11))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        values = [r.get(key) or 0 for r in rows]
        colors = [
            "#2ca02c" if r["system"] == "durq" else COLORS.get(r["broker"], "grey") for r in rows
        ]
        bars = ax.bar(range(len(rows)), values, color=colors)
        for bar, value in zip(bars, values, strict=True):
            if value:
                ax.annotate(
                    f"{value:,.0f}",
                    (bar.get_x() + bar.get_width() / 2, value),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"durq and peers, {data['machine_line']} ({data['tasks']:,} tasks)", fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
