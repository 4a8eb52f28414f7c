"""``make zoo``: export the model zoo into a throwaway repository and print the table; exit 1 when the zoo
departs from its catalog (an unexpected refusal, or an expected one that no longer happens).

Usage: ``python -m examples.zoo [--repository DIR] [--model NAME ...] [--markdown]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from rich.console import Console

from examples.zoo.catalog import ZOO
from examples.zoo.run import ZooRow, export_zoo, markdown_table, problems, rich_table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", help="keep the exports here (default: a temporary folder, removed)")
    parser.add_argument("--model", action="append", choices=[m.name for m in ZOO], help="only these models")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    args = parser.parse_args()
    console = Console()
    console = Console(width=max(console.width, 150))  # the table's rows stay one line each when piped
    models = [m for m in ZOO if not args.model or m.name in args.model]

    def report(row: ZooRow) -> None:
        outcome = "refused" if row.refusal else "exported"
        console.print(f"{row.served_name}: {outcome} in {row.seconds:.1f} s", highlight=False)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="switchyard-zoo-") as scratch:
        rows = export_zoo(args.repository or scratch, models, progress=report)
        if args.markdown:
            console.print(markdown_table(rows), highlight=False, soft_wrap=True)
        else:
            console.print(rich_table(rows))
    console.print(f"{len(rows)} exports in {time.perf_counter() - started:.0f} s", highlight=False)
    found = problems(rows)
    for problem in found:
        console.print(f"[red]{problem}[/red]", highlight=False)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
