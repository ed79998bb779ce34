"""Generate benchmarks/README.md from benchmarks/results/*.json (see gangctl/harness/results.py).

    .venv/bin/python benchmarks/results_page.py            # write the page
    .venv/bin/python benchmarks/results_page.py --check    # exit 1 if the page is not what the results give
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gangctl.harness import results  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    text = results.page(results.load())
    if args.check:
        if results.PAGE.read_text() != text:
            print(f"{results.PAGE} differs from the results: run benchmarks/results_page.py", file=sys.stderr)
            return 1
        return 0
    results.PAGE.write_text(text)
    print(f"{results.PAGE}: {len(text.splitlines())} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
