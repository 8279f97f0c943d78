"""Write the exit-code tables of README.md and docs/exit-codes.md from loadgen/errors.py.

    python scripts/exit_codes.py           # rewrite the generated blocks
    python scripts/exit_codes.py --check   # exit 1, naming the pages, when one differs

Each page holds its blocks between `<!-- exit codes...: generated ... -->` and
`<!-- end of exit codes... -->`; everything else on the page is written by hand.
`tests/cli/test_exits.py` fails when a page differs from what this would write.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadgen.cli.exits import PAGES, regenerated

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 on a stale page"
    )
    args = parser.parse_args()
    stale = []
    for page, (link_base, blocks) in PAGES.items():
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        written = regenerated(text, link_base, blocks)
        if written != text:
            stale.append(page)
            if not args.check:
                path.write_text(written, encoding="utf-8")
    verb = "differs from loadgen/errors.py" if args.check else "written"
    for page in stale:
        print(f"{page}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
