"""``python -m transport.channels --list | --cleanup [--json]``: the channel segments in /dev/shm
(kind, size, state, owner, stale; entries named like one that are not: foreign, unreadable) and
the removal of stale ones (the channel magic and a dead owner; nothing else is ever removed).
Exit 1 when a stale segment could not be removed (named on stderr; the others still are)."""

from __future__ import annotations

import argparse
import json
import sys

from transport.channels.segment import cleanup_stale, list_segments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transport.channels", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list the channel segments")
    action.add_argument("--cleanup", action="store_true", help="unlink the stale ones")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    errors: list[str] = []
    infos = cleanup_stale(errors) if args.cleanup else list_segments()
    for text in errors:  # a segment that could not be removed: the others still were
        print(f"python -m transport.channels: {text}", file=sys.stderr)
    if args.json:
        print(json.dumps([i.to_json() for i in infos], indent=2))
        return 1 if errors else 0
    ours = [i for i in infos if i.ours]
    verb = "removed" if args.cleanup else "found"
    others = len(infos) - len(ours)
    more = (
        f" (and {others} other entr{'y' if others == 1 else 'ies'} named like one)"
        if others
        else ""
    )
    print(f"{len(ours)} channel segment(s) {verb}{more}")
    for i in infos:
        print(f"  {i.describe()}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
