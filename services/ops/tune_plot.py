"""The Pareto plot (throughput vs p99 at the highest concurrency) as a PNG. matplotlib is the ``tune`` extra's
and is imported only when a plot is drawn: the gateway and the root command never load it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.extras import require


def pareto_png(run: dict[str, Any], path: Path) -> Path:
    require("matplotlib", extra="tune", feature="the tuning plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slo = float(run["options"]["p99_ms"])
    front = set(run.get("pareto_front") or [])
    winner = (run.get("winner") or {}).get("number")
    points = []
    for trial in run.get("trials", []):
        if trial.get("error") or not trial["measurements"]:
            continue
        top = max(trial["measurements"], key=lambda m: m["concurrency"])
        points.append((trial, top))
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for trial, top in points:
        colour = "tab:green" if trial["number"] == winner else "tab:blue" if trial["number"] in front else "tab:gray"
        marker = "s" if trial["default"] else "o"
        size = 70 if trial["number"] == winner else 40 if trial["number"] in front else 18
        alpha = 0.45 if trial["round"] == 0 else 1.0  # screened at the highest level only
        axes.scatter(top["p99_ms"], top["throughput"], c=colour, marker=marker, s=size, alpha=alpha)
    frontier = sorted((top["p99_ms"], top["throughput"]) for trial, top in points if trial["number"] in front)
    if frontier:
        axes.plot([p for p, _ in frontier], [t for _, t in frontier], c="tab:blue", lw=1)
    axes.axvline(slo, c="tab:red", ls="--", lw=1, label=f"SLO p99 {slo:g} ms")
    if winner is not None:
        axes.scatter([], [], c="tab:green", label="winner")
    axes.scatter([], [], c="tab:blue", label="Pareto front")
    axes.scatter([], [], c="gray", marker="s", label="current config")
    level = max((top["concurrency"] for _, top in points), default=0)
    axes.set(xlabel=f"p99 latency (ms) at {level} clients", ylabel="throughput (req/s)", xscale="log")
    axes.set_title(f"tuning '{run['model']}': Pareto front")
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
