"""transport-probe before and after a change, in one run: the same rows, side by side.

  python benchmarks/probe_before_after.py BASE_REV [--rounds 3] [--markdown benchmarks/RESULTS.md]
      [-- PROBE ARGS...]

Checks out BASE_REV in a temporary git worktree (its Python runs from that tree with this
checkout's venv; its Node server is built with this checkout's node_modules; its native module
is compiled in place), then runs `transport-probe` alternately on the base and on this checkout,
``--rounds`` times each, so that both see the same machine at the same moments. Per row (backend
x server x batch) it keeps the best p50 and the best p99 of the rounds (the least disturbed by
the other tenants of a shared machine) and prints them side by side with `after / before`.
With --markdown it rewrites the `<!-- probe-before-after:begin -->` block of that file. The
temporary worktree is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HEAD = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HEAD))
from transport.probe.report import update_markdown  # noqa: E402

BEGIN = "<!-- probe-before-after:begin -->"
END = "<!-- probe-before-after:end -->"
Key = tuple[str, str, int, str]


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {cwd}:\n{done.stdout}\n{done.stderr}")


def prepare_base(rev: str, where: Path) -> None:
    """A worktree of ``rev`` whose Python, native module and Node server are ready to run."""
    run(["git", "worktree", "add", "--detach", str(where), rev], HEAD)
    modules = HEAD / "node_bridge" / "node_modules"
    (where / "node_bridge" / "node_modules").symlink_to(modules)
    run([str(modules / ".bin" / "tsc"), "-p", "."], where / "node_bridge")
    env = {**os.environ, "PYTHONPATH": str(where)}
    run([sys.executable, "-m", "transport.native.build"], where, env)


def probe(tree: Path, out: Path, args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "transport.tools.probe_cli", "--no-plot", "--quiet"]
    run([*command, "--json", str(out), *args], tree, env)
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def best(docs: list[dict[str, Any]]) -> dict[Key, dict[str, float]]:
    """Per row: the lowest p50 and the lowest p99 over the rounds."""
    rows: dict[Key, dict[str, float]] = {}
    for doc in docs:
        for row in doc["rows"]:
            key = (row["backend"], row["server"], int(row["batch"]), row.get("message", "step"))
            seen = rows.setdefault(key, {"p50_us": row["p50_us"], "p99_us": row["p99_us"]})
            seen["p50_us"] = min(seen["p50_us"], row["p50_us"])
            seen["p99_us"] = min(seen["p99_us"], row["p99_us"])
    return rows


def table(before: dict[Key, dict[str, float]], after: dict[Key, dict[str, float]]) -> str:
    lines = [
        "| backend | server | batch | p50 before | p50 after | after/before | p99 before "
        "| p99 after | after/before |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(set(before) | set(after), key=lambda k: (k[0].startswith("c-"), k)):
        b, a = before.get(key), after.get(key)
        cells = [key[0], key[1], str(key[2])]
        for field in ("p50_us", "p99_us"):
            x = b[field] if b else None
            y = a[field] if a else None
            ratio = f"{y / x:.2f}" if x and y else "-"
            cells += [_us(x), _us(y), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the git revision to compare with (e.g. a commit or tag)")
    parser.add_argument("--rounds", type=int, default=3, help="probe runs per side (default 3)")
    parser.add_argument("--markdown", type=Path, default=None, help="rewrite this file's block")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    extra = argv[split + 1 :]  # after --: transport-probe options
    head_rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HEAD, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="probe-before-after-") as tmp:
        base_tree = Path(tmp) / "base"
        try:
            prepare_base(args.base, base_tree)
            docs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for r in range(args.rounds):
                for side, tree in (("before", base_tree), ("after", HEAD)):
                    print(f"round {r + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
                    docs[side].append(probe(tree, Path(tmp) / f"{side}-{r}.json", extra))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(base_tree)],
                cwd=HEAD,
                capture_output=True,
            )
    text = table(best(docs["before"]), best(docs["after"]))
    machine = docs["after"][-1].get("machine", {})
    block = "\n".join(
        [
            BEGIN,
            "## transport-probe before and after, one run",
            "",
            f"`python benchmarks/probe_before_after.py {args.base} --rounds {args.rounds}"
            + (f" -- {' '.join(extra)}" if extra else "")
            + f"`: before = {args.base}, after = {head_rev}, run alternately on one machine "
            f"({machine.get('cpu_model', '?')}, {machine.get('cpu_count', '?')} CPUs); "
            f"per row the best p50 and the best p99 of {args.rounds} rounds.",
            "",
            text,
            END,
        ]
    )
    print(text)
    if args.markdown is not None:
        update_markdown(str(args.markdown), block, BEGIN, END)
        print(f"wrote {args.markdown} (before/after block)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
