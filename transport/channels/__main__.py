"""``python -m transport.channels --list | --cleanup [--json]``: the channel segments in /dev/shm
(kind, size, state, owner, stale) and the removal of stale ones (dead owners)."""

from __future__ import annotations

import argparse
import json

from transport.channels.segment import cleanup_stale, list_segments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transport.channels", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list the channel segments")
    action.add_argument("--cleanup", action="store_true", help="unlink the stale ones")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    infos = cleanup_stale() if args.cleanup else list_segments()
    if args.json:
        print(json.dumps([i.to_json() for i in infos], indent=2))
        return 0
    verb = "removed" if args.cleanup else "found"
    print(f"{len(infos)} channel segment(s) {verb}")
    for i in infos:
        owner = f"pid {i.owner_pid} {'alive' if i.owner_alive else 'dead'}"
        stale = "  STALE" if i.stale else ""
        print(f"  {i.path}  {i.kind}  {i.size} bytes  {i.state}  {owner}{stale}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
