"""transport-probe: round-trip latency distributions of every backend, next to a C floor."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from transport.errors import TransportError
from transport.probe.servers import PROBE_ENVS
from transport.tools import quiet_on_broken_pipe
from transport.tools.cli_args import ArgumentParser, positive_seconds, schema_path

DEFAULT_DIR = Path("probe-results")
DEFAULT_JSON = DEFAULT_DIR / "transport-probe.json"
DEFAULT_PLOT = DEFAULT_DIR / "transport-probe.png"

_DESCRIPTION = """\
Measure step round trips over every available backend against the reference servers, next to
a C floor, and report latency distributions.

With no arguments: for each backend of the registry (unix, http, and zmq+ipc, zmq+tcp, shm
once registered) and each server language (python, node), for batch sizes 1, 8 and 64, start
`transport-serve URL --env echo --lang L --num-envs B`, connect, reset, warm up, record every
round trip of a closed-loop ping-pong into a log-bucket histogram (2 significant digits),
check one echo response, stop the server and check that it left nothing behind. Then print
the table, write the JSON and two PNGs (default: probe-results/transport-probe.json, .png
and -bars.png under the current directory).

  transport-probe                               # everything available, defaults
  transport-probe --backends unix,http --lang python --batch 1
  transport-probe --rate 2000                   # open loop at 2000 round trips/s
  transport-probe --sweep --lang python         # latency vs payload, 64 B .. 4 MiB
  transport-probe --url unix:///tmp/pac.sock    # any server that is already running
  transport-probe --quick --json out.json --plot out.png     # CI smoke run
  transport-probe --env vector-echo --batch 64,256   # one vector env object steps all B envs

The echo env computes almost nothing, so a row is the cost of the transport (and, with
--env echo, of one Python env object per env in the server: ~0.75 us each; --env vector-echo
steps the same bytes in one NumPy call, ~0.1 us per env). A round trip of
batch B is one batched step of B envs (one request with B actions, one response with B
StepResults of 2557 bytes: payload_bytes = B * 2557); env-steps/s counts env steps (B per
round trip): `transport-probe --batch 256` prints each backend's env-steps/s at 256 envs.
"""

_EPILOG = """\
what it prints and writes:
  table      one row per backend x server x batch (the floors in a section of their own
             below it, then a summary: the fastest backend per batch size, how many times
             faster than unix, how far from its floor; then per batch size one line of
             env-steps/s, every backend x server row, highest first):
             payload B  response bytes per round trip (B x 2557; 1 for a health round trip)
             p50 .. max round-trip latency percentiles in microseconds (HdrHistogram-style
                        log buckets, <= 0.78 % wide; max is exact)
             env-steps/s  env steps per second (round trips/s x batch; JSON
                        steps_per_s); closed loop: the throughput of one client; open
                        loop: the achieved rate x batch
             x floor    this row's p50 / the p50 of the floor that applies to it, named in
                        column floor: shm rows c-floor-shm (the same bytes through shared
                        memory; c-floor-spin where it was not measured) when they spin while
                        waiting (wait policy balanced, spin), c-floor-futex when they sleep
                        (wait=futex); socket rows raw-<scheme>/<server> (a bare server of
                        the same language moving the same bytes, no protocol), else the C
                        socket floor of the same bytes (c-floor-unix, c-floor-tcp)
  floors     c-floor-spin and c-floor-futex (server "c"): two processes ping-ponging one
             32-bit word over shared memory in C (transport/native), spinning or sleeping in
             FUTEX_WAIT; c-floor-shm: a row's request and response bytes copied through a
             shared mapping with spin-waited hand-offs, one row per batch; c-floor-unix and
             c-floor-tcp: the same two processes sending a row's request and response bytes
             (frame headers included) over a connected Unix or loopback TCP socket, in C:
             what no transport can beat on this machine;
             raw-<scheme> (server python or node): a bare server of that language on that
             socket stack moving a row's bytes, no protocol. Printed under the rows: the
             shared-memory floors as a sentence each, the socket floors one line per floor
             and language with a "p50 (p99)" column per batch size
  JSON       {"machine": CPU model, cores, affinity, kernel, /dev/shm, versions of Python,
             Node, pyzmq, libzmq, numpy; "settings"; "floor"; "rows": [{backend, server,
             batch, message, payload_bytes, request_bytes, target_bytes, mode, rate, count,
             warmup, min_us, mean_us, p50_us, p90_us, p99_us, p999_us, max_us, steps_per_s,
             round_trips_per_s, ratio_to_floor, floor, url, env, histogram}], "skipped":
             [...], "failed": [...], "ok"}. backend is the URL scheme; server is python,
             node or c; env the env the server serves (null for floors).
  PNG        FILE: per batch size, the CDF of that batch's rows (log x; y in "nines": 90 %,
             99 %, 99.9 %), color = backend, line style = server language (python solid,
             node dashed), the C floors of those rows' kinds (spin or futex, Unix or TCP
             socket) as thin grey lines at their p50; with --sweep, p50 and p99 against
             payload bytes.
             FILE-bars.png: per batch size, a bar per backend x server language: p50, a
             whisker to p99, a grey mark at the p50 of its floor.

skipped vs failed:
  skipped    unavailable on this machine: a backend not in the registry, whose module does
             not import, or without a URL template; node not installed or node_bridge/dist
             not built; a server that does not start on that backend (no "ready" line, for
             example the Node server does not implement it yet). Reported, exit status 0.
  failed     a server that started and then broke: connect or a request failed, a wrong echo
             response, the server died, did not stop on SIGTERM, or left a socket file or a
             /dev/shm segment behind (the probe removes it). Exit status 1.

output paths are checked before anything is measured (their folder exists or can be made and
is writable, the path is not a folder): one that cannot be written is bad usage. An output that
still fails as it is written is one line on stderr (the table holds the results) and exit 1.

exit status: 0 when nothing failed (skips allowed), 1 when something failed or an output could
not be written, 2 for bad usage (a --url that is not scheme://address of a known backend, or
with --env/--lang/--backends/--batch/--payload/--sweep; an output path that cannot be written).
Runs under about 3 minutes with the defaults on a 2-core machine; see docs/probe.md.
"""


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected integers >= 1")
    return values


def _size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if text and text[-1] in "KMG":
        scale = 1024 ** ("KMG".index(text[-1]) + 1)
        text = text[:-1]
    try:
        value = int(float(text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (examples: 2557, 64K, 4M)"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError("sizes must be >= 1 byte")
    return value


def _size_list(text: str) -> list[int]:
    return [_size(v) for v in text.split(",") if v.strip()]


def _names(text: str) -> list[str]:
    return [v.strip().lower() for v in text.split(",") if v.strip()]


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(143)  # unwinds through the runner, which stops the current server


def _registered() -> list[str]:
    from transport.probe.servers import registered_backends

    return registered_backends()


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="transport-probe",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to probe")
    what.add_argument(
        "--url",
        help="probe this running server instead of starting the reference servers: any "
        "backend, env count, schema (discovered in the handshake) and action space (a batch "
        "of legal actions: the first unmasked one, MultiDiscrete and Discrete starts, "
        "MultiBinary zeros, Box 0 clipped into its bounds; the echo env keeps its echo check); "
        "the report names the server's env (unknown when no handshake named it); "
        "--backends/--lang/--batch/--payload/--sweep/--env do not apply (a usage error)",
    )
    what.add_argument(
        "--schema",
        type=schema_path,
        default=None,
        help="with --url: pin the session to this schema file (TOML) instead of discovering "
        "the server's (a server with another schema is refused)",
    )
    what.add_argument(
        "--backends",
        type=_names,
        metavar="A,B",
        help="URL schemes to probe (default: every backend of the registry "
        f"transport.backends.BACKENDS, here: {','.join(_registered())})",
    )
    what.add_argument(
        "--lang",
        type=_names,
        metavar="L,L",
        help="server languages (default: python,node)",
    )
    what.add_argument(
        "--batch",
        type=_int_list,
        metavar="B,B",
        help="envs per round trip: one batched step of B envs against a server started with "
        "--num-envs B (default: 1,8,64; none when --payload or --sweep is given)",
    )
    what.add_argument(
        "--payload",
        type=_size_list,
        metavar="BYTES,..",
        help="target response sizes (suffixes K, M): each becomes a batch of "
        "round(BYTES / 2557) envs, so payload_bytes (the actual response) is the nearest "
        "multiple of 2557 (at least 1 env); a target under 320 bytes becomes a health round "
        "trip (a 1-byte response, the smallest round trip of the protocol). The default "
        "payload is one 2557-byte StepResult per env",
    )
    what.add_argument(
        "--sweep",
        action="store_true",
        help="payload sweep: --payload 64,256,1K,4K,16K,64K,256K,1M,4M (log scale), measured as "
        "a health round trip (64 and 256), then batches of 1, 2, 6, 26, 103, 410 and 1640 envs "
        "(1 B to 4,193,480 B responses), plotted as latency vs payload",
    )
    what.add_argument(
        "--env",
        choices=PROBE_ENVS,
        help="the env the reference servers serve: echo (one EchoEnv object per env, default) or "
        "vector-echo (the same bytes from one vector env object that steps all B envs: the "
        "transport without per-env Python in the server); not with --url (the server serves "
        "its own)",
    )
    what.add_argument("--no-floor", action="store_true", help="do not measure the C floor rows")
    how = p.add_argument_group("how to measure")
    how.add_argument(
        "--count",
        type=int,
        help="round trips recorded per row (default 5000; --quick 200); a row also stops "
        "after --duration seconds",
    )
    how.add_argument(
        "--warmup",
        type=int,
        help="round trips before recording (default 5000: a fresh Node server needs a few thousand "
        "before V8 has optimised it; --quick 20), at most half of --duration",
    )
    how.add_argument(
        "--duration",
        type=float,
        help="seconds of recording per row at most (default 2; --quick 0.3)",
    )
    how.add_argument(
        "--rate",
        type=float,
        metavar="R",
        help="open loop: send R round trips per second on a fixed schedule and measure each "
        "from its scheduled time (coordinated-omission correction: a stall also delays, and "
        "shows in, every request due during it). Default: closed-loop ping-pong",
    )
    how.add_argument(
        "--timeout",
        type=positive_seconds,
        default=10.0,
        help="seconds any one request may take (10)",
    )
    how.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run for CI: few samples (count 200, warmup 20, duration 0.3 s)",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--json",
        metavar="FILE",
        default=str(DEFAULT_JSON),
        help=f"the JSON results ('-': stdout, the table then goes to stderr; default "
        f"{DEFAULT_JSON})",
    )
    out.add_argument(
        "--plot",
        metavar="FILE",
        default=str(DEFAULT_PLOT),
        help=f"the PNG (default {DEFAULT_PLOT})",
    )
    out.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    out.add_argument(
        "--markdown",
        "--results-md",
        metavar="FILE",
        help="also rewrite the <!-- probe:begin --> ... <!-- probe:end --> block of FILE "
        "(e.g. benchmarks/RESULTS.md) with the table, the command and the machine; the rest "
        "of the file is left as is; the file or the block is created if missing",
    )
    out.add_argument(
        "--progress",
        action="store_true",
        help="draw the progress bar on stderr even when it is not a terminal (default: a bar "
        "on a terminal, one plain line per row otherwise)",
    )
    out.add_argument("--quiet", action="store_true", help="no progress output at all")
    return p


@quiet_on_broken_pipe
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    words = sys.argv[1:] if argv is None else argv
    command = shlex.join(["transport-probe", *words])

    from transport.probe import report
    from transport.probe.machine import machine_info, summary
    from transport.probe.progress import Progress
    from transport.probe.runner import (
        SWEEP_TARGETS,
        Point,
        Results,
        Settings,
        apply_floor,
        floor_count,
        floor_rows,
        plan,
        points_for_payloads,
        probe_url,
        raw_floor_plan,
        raw_floor_rows,
        run,
        step_result_size,
    )
    from transport.probe.servers import LANGS, default_backends, registered_backends

    quick = args.quick
    count = args.count if args.count is not None else (200 if quick else 5000)
    warmup = args.warmup if args.warmup is not None else (20 if quick else 5000)
    duration = args.duration if args.duration is not None else (0.3 if quick else 2.0)
    if count < 1 or warmup < 0 or duration <= 0:
        parser.error("--count must be >= 1, --warmup >= 0 and --duration > 0")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    langs = args.lang if args.lang is not None else ["python", "node"]
    for lang in langs:
        if lang not in LANGS:
            parser.error(f"--lang: unknown language {lang!r} (choose from {', '.join(LANGS)})")
    if args.url is not None:  # "" too: an unset variable is a usage error, not the default run
        problem = _url_problem(args.url)
        if problem is not None:
            parser.error(f"--url: {problem}")
        given = [
            flag
            for flag, value in (
                ("--backends", args.backends),
                ("--lang", args.lang),
                ("--batch", args.batch),
                ("--payload", args.payload),
                ("--sweep", args.sweep or None),
                ("--env", args.env),
            )
            if value is not None
        ]
        if given:
            verb = "does" if len(given) == 1 else "do"
            parser.error(
                "--url probes the server as it is (its own backend, language, env count and "
                f"env): {', '.join(given)} {verb} not apply"
            )
    elif args.schema is not None:
        parser.error("--schema goes with --url (the reference servers speak pac_env)")
    _check_outputs(parser, args)

    result_size = step_result_size()
    points: list[Point] = []
    if args.batch is not None or (args.payload is None and not args.sweep):
        points += [Point(b) for b in (args.batch or [1, 8, 64])]
    targets = list(args.payload or []) + (list(SWEEP_TARGETS) if args.sweep else [])
    if targets:
        points += points_for_payloads(targets, result_size)
    order = registered_backends()
    backends = args.backends if args.backends is not None else default_backends()
    unknown = [b for b in backends if b not in order]
    if unknown:
        parser.error(
            f"--backends: unknown backend(s) {', '.join(unknown)} (choose from {', '.join(order)})"
        )
    settings = Settings(
        backends=backends,
        langs=langs,
        points=points,
        count=count,
        warmup=warmup,
        duration=duration,
        rate=args.rate,
        timeout=args.timeout,
        floor=not args.no_floor,
        env=args.env or "echo",
    )
    table_out = sys.stderr if args.json == "-" else sys.stdout
    machine = machine_info()  # before the run: the load average is the machine's, not ours
    bar = args.progress or sys.stderr.isatty()

    if args.url is not None:
        from transport.backends import scheme_of

        settings.backends = [scheme_of(args.url)]
        settings.points = []
        settings.env = "unknown"  # until the server's HELLO names it
        if args.schema is not None:
            from transport import load_schema

            try:
                settings.schema = load_schema(args.schema)
            except TransportError as exc:
                parser.error(f"--schema: {exc}")
        cells = floor_count(settings) + 1  # the row's own socket floors: once known
        progress = Progress(cells, bar=bar, quiet=args.quiet)
        results = Results()
        if settings.floor:
            floor_rows(settings, results, progress)
        progress.begin(args.url)
        seen: dict[str, Any] = {}  # what the handshake said, for a failure's line
        try:
            row = probe_url(args.url, None, settings, progress=progress, seen=seen)
            results.rows.append(row)
            settings.env = row.env
            progress.end(row.label, f"p50 {row.us(50):.1f} us")
            if settings.floor:  # the floors of this row's bytes, now that they are known
                sizes = (row.payload_bytes // row.point.batch, row.request_bytes // row.point.batch)
                settings.points = [row.point]
                settings.langs = [row.server] if row.server in LANGS else []
                settings.backends = [row.backend]
                progress.total += floor_count(settings) - 2 + len(raw_floor_plan(settings))
                floor_rows(settings, results, progress, sockets_only=True, sizes=sizes)
                raw_floor_rows(settings, results, progress, sizes=sizes)
        except Exception as exc:
            from transport.probe.runner import Problem

            settings.env = str(seen.get("env", "unknown"))
            results.failed.append(
                Problem(
                    str(seen.get("backend", settings.backends[0])),
                    str(seen.get("server", "unknown")),
                    seen.get("batch"),
                    f"{type(exc).__name__}: {exc}",
                    env=settings.env,
                )
            )
            progress.end(args.url, f"FAILED: {exc}")
        apply_floor(results)
    else:
        cells = len(plan(settings)) + floor_count(settings) + len(raw_floor_plan(settings))
        progress = Progress(cells, bar=bar, quiet=args.quiet)
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            results = run(settings, progress)
        except (KeyboardInterrupt, SystemExit) as exc:
            progress.close()
            print("transport-probe: interrupted (servers stopped)", file=sys.stderr)
            return 130 if isinstance(exc, KeyboardInterrupt) else 143
        finally:
            signal.signal(signal.SIGTERM, previous)
    progress.close()

    rows = report.transport_rows(results, order)
    print(f"transport-probe: {summary(machine)}", file=table_out)
    mode = "closed loop" if settings.rate is None else f"open loop at {settings.rate:g}/s"
    envs = report.env_phrase(results.rows, settings.env)
    print(
        f"{envs}, {mode}, up to {count} samples per row after {warmup} warm-up; latencies in "
        f"us;\nx floor = {report.FLOOR_RULE_SHORT}",
        file=table_out,
    )
    print(report.text_table(rows), file=table_out)
    floors = report.floors_text(results.floors)
    if floors:
        print(f"\n{floors}", file=table_out)
        for note in report.floor_notes(rows):
            print(f"  note: {note}", file=table_out)
    closing = report.summary_text(rows)
    if closing:
        print(f"\n{closing}", file=table_out)
    problems = report.problems_text(results)
    if problems:
        print(problems, file=table_out)

    doc = report.document(results, settings, machine, command, order)
    unwritten = 0

    def write(flag: str, path: str, action: Callable[[], object]) -> bool:
        """Run ``action``; a write error is one line (the table above holds the results)."""
        nonlocal unwritten
        try:
            action()
        except (OSError, ValueError) as exc:
            unwritten += 1
            reason = " ".join(str(exc).split())
            print(f"transport-probe: error: cannot write {flag} {path}: {reason}", file=sys.stderr)
            return False
        return True

    written: list[str] = []
    if args.json == "-":
        report.write_json(doc, args.json)
    elif write("--json", args.json, lambda: report.write_json(doc, args.json)):
        written.append(args.json)
    if not args.no_plot:
        from transport.probe.plot import plot

        title = f"transport-probe, {envs}, {mode}. {summary(machine)}"
        figures: list[str] = []
        try:
            write(
                "--plot",
                args.plot,
                lambda: figures.extend(
                    plot(results.rows, results.floors, args.plot, title=title, backends=order)
                ),
            )
            written += figures
        except ImportError:
            print(
                "transport-probe: no plot: matplotlib is not installed "
                "(pip install 'transport[tools]', or pass --no-plot)",
                file=sys.stderr,
            )
    if args.markdown is not None:
        block = report.markdown_block(results, machine, command, order, env=settings.env)
        if write("--markdown", args.markdown, lambda: report.update_markdown(args.markdown, block)):
            written.append(f"{args.markdown} (probe block)")
    if written:
        print(f"wrote {', '.join(written)}", file=table_out)
    if results.failed:
        print(f"transport-probe: {len(results.failed)} failure(s), see above", file=sys.stderr)
        return 1
    if unwritten:
        print(f"transport-probe: {unwritten} output(s) not written, see above", file=sys.stderr)
        return 1
    return 0


def _url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a server's URL (a usage error, before anything is measured), or
    None: empty, no ``scheme://``, a scheme no backend serves, nothing after the scheme."""
    from transport.backends import BACKENDS, scheme_of

    if not url.strip():
        return "an empty URL (an unset variable?): expected scheme://address"
    try:
        scheme = scheme_of(url)
    except TransportError as exc:
        return str(exc)
    if scheme not in BACKENDS:
        known = ", ".join(f"{name}://" for name in BACKENDS)
        return f"no backend for {scheme}:// in {url!r} (known: {known})"
    if not url.partition("://")[2].strip():
        return f"{url!r} has no address after {scheme}://"
    return None


def _check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before anything is measured, an output path that cannot be written
    (``report.output_problem``; the plot's two figures, and a suffix matplotlib cannot write)."""
    from transport.probe import report
    from transport.probe.plot import bars_path

    outputs: list[tuple[str, str, str, bool]] = []
    if args.json != "-":
        outputs.append(("--json", args.json, args.json, False))
    if not args.no_plot:
        outputs.append(("--plot", args.plot, args.plot, False))
        if args.plot:
            bars = str(bars_path(args.plot))
            outputs.append(("--plot", bars, f"{args.plot}: its second figure {bars}", False))
    if args.markdown is not None:
        outputs.append(("--markdown", args.markdown, args.markdown, True))
    for flag, path, name, markdown in outputs:
        problem = report.output_problem(path, markdown=markdown)
        if problem is not None:
            parser.error(f"{flag} {name}: {problem}")
    if not args.no_plot and Path(args.plot).suffix:
        try:
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            return  # said after the run: no plot without matplotlib
        kind = Path(args.plot).suffix[1:].lower()
        known = FigureCanvasBase.get_supported_filetypes()
        if kind not in known:
            parser.error(
                f"--plot {args.plot}: matplotlib cannot write .{kind} files "
                f"(use one of .{', .'.join(sorted(known))})"
            )


if __name__ == "__main__":
    sys.exit(main())
