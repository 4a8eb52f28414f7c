"""bench.py's PNG: throughput and p99 latency against concurrent clients, one column per model."""

from __future__ import annotations

from pathlib import Path

from result import Result
from workload import MODELS


def plot(results: list[Result], png: Path) -> None:
    # Imported here: matplotlib is a dev extra and slow to import; the naive baseline process never plots.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(MODELS), figsize=(6 * len(MODELS), 8), squeeze=False)
    for column, model in enumerate(MODELS):
        for mode in sorted({r.mode for r in results if r.model == model and not r.mode.startswith("in-process")}):
            series = sorted((r for r in results if r.model == model and r.mode == mode), key=lambda r: r.concurrency)
            xs = [r.concurrency for r in series]
            axes[0][column].plot(xs, [r.throughput for r in series], marker="o", label=mode)
            axes[1][column].plot(xs, [r.percentile(99) for r in series], marker="o", label=mode)
        for r in results:
            if r.model == model and r.mode.startswith("in-process"):
                style = ":" if r.mode.endswith("b1") else "--"
                axes[0][column].axhline(r.throughput, linestyle=style, linewidth=1, label=r.mode, color="grey")
        axes[0][column].set_yscale("log")
        axes[0][column].set_title(f"{model}: throughput")
        axes[0][column].set_ylabel("rows / s")
        axes[1][column].set_title(f"{model}: p99 latency")
        axes[1][column].set_ylabel("ms")
        for row in axes:
            row[column].set_xscale("log", base=2)
            row[column].set_xlabel("concurrent clients")
            row[column].legend(fontsize="small")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    print(f"\nplot written to {png}")
