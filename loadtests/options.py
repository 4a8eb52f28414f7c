"""The command-line options both benches share, so that they mean the same thing in each."""

from __future__ import annotations

import argparse
from pathlib import Path

from workload import ROOT


def bench_parser(description: str | None, concurrency: list[int]) -> argparse.ArgumentParser:
    """A parser with the repository, run timing and client counts; each bench adds its own options after."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=concurrency)
    return parser
