"""The probe run: plan the cells, start each reference server, measure, stop, check leftovers.

A cell is one backend x server language x batch size (or sweep point). For each cell the
runner starts ``transport-serve URL --env echo --lang L --num-envs B`` as a child process,
connects with ``transport.connect``, resets, warms up, measures (closed or open loop), checks
one response against the echo env's contract, disconnects, stops the server with SIGTERM and
looks for files left with the cell's tag. Outcomes:

- ok: a row with the percentiles and the histogram;
- skipped: the backend or language is unavailable on this machine (not registered, module
  does not import, no URL template, node or node_bridge/dist missing, the server does not
  start on this backend);
- failed: something that is available broke: connect or a request failed after "ready", a
  wrong response, the server died, did not stop on SIGTERM or left files behind.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transport.probe.floor import (
    BYTE_FLOOR_KINDS,
    FLOOR_OF_SCHEME,
    REFERENCE,
    FloorResult,
    FloorUnavailable,
    measure_floor,
    measure_shm_floor,
    measure_socket_floor,
)
from transport.probe.histogram import LogHistogram
from transport.probe.loops import LoopStats, closed_loop, open_loop, warm_up
from transport.probe.progress import Progress
from transport.probe.raw import RAW_SCHEMES, measure_raw, raw_name
from transport.probe.servers import (
    PROBE_ENVS,
    URL_TEMPLATES,
    ServerProcess,
    ServerStartError,
    backend_unavailable,
    lang_unavailable,
    leftovers,
    remove,
)

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
NUM_ACTIONS = 92  # echo accepts any action; stay inside pac_env's action space anyway
HEALTH_BYTES = 1
FRAME_HEADER_BYTES = 9  # a socket floor sends what the stream backends send: header + body
SWEEP_TARGETS = tuple(64 * 4**k for k in range(9))  # 64 B, 256 B, ... 4 MiB


def step_result_size() -> int:
    """Bytes of one env's StepResult in the reference schema (2557 for pac_env)."""
    from transport.client import default_schema

    schema = default_schema()
    body = schema.ir.messages["STEP_RESP"].body
    assert body is not None
    return int(schema[body].size)


def step_request_size() -> int:
    from transport.client import default_schema

    schema = default_schema()
    body = schema.ir.messages["STEP_REQ"].body
    assert body is not None
    return int(schema[body].size)


@dataclass(frozen=True)
class Point:
    """What one cell sends: ``batch`` envs per round trip (``message`` step), or a health check
    (the protocol's smallest round trip: a 1-byte response)."""

    batch: int
    message: str = "step"  # "step" | "health"
    target_bytes: int | None = None  # the --payload / --sweep target it stands for

    def response_bytes(self, result_size: int) -> int:
        return HEALTH_BYTES if self.message == "health" else self.batch * result_size

    def request_bytes(self, request_size: int) -> int:
        return 0 if self.message == "health" else self.batch * request_size


def points_for_payloads(targets: Sequence[int], result_size: int) -> list[Point]:
    """One point per target response size: a batch of ``round(target / result_size)`` envs
    (at least 1), or a health round trip when the target is under an eighth of a StepResult
    (320 bytes for pac_env). Targets that map to the same point are measured once."""
    seen: dict[tuple[int, str], Point] = {}
    for target in targets:
        if target * 8 < result_size:
            point = Point(1, "health", target)
        else:
            point = Point(max(1, round(target / result_size)), "step", target)
        seen.setdefault((point.batch, point.message), point)
    return sorted(seen.values(), key=lambda p: p.response_bytes(result_size))


@dataclass
class Settings:
    backends: list[str]
    langs: list[str]
    points: list[Point]
    count: int = 5000
    warmup: int = 5000
    duration: float = 2.0  # seconds: a cell stops measuring after this, whatever ``count``
    rate: float | None = None
    timeout: float = 10.0
    floor: bool = True
    ready_timeout: float = 30.0
    schema: Any = None  # --url with --schema: the user's schema (a transport Schema)
    env: str = "echo"  # the env the servers serve (--url: the server's own, from its HELLO)


@dataclass
class Row:
    backend: str
    server: str
    point: Point
    payload_bytes: int
    request_bytes: int
    hist: LogHistogram
    stats: LoopStats
    mode: str  # "closed" | "open"
    rate: float | None = None
    warmup: int = 0
    service: LogHistogram | None = None  # open loop: send -> response, without the wait
    url: str = ""
    ratio_to_floor: float | None = None
    floor_name: str | None = None
    env: str = "echo"  # the env the server serves (HELLO's info "env")

    @property
    def is_floor(self) -> bool:
        """A floor row (C or raw): a reference, not a transport."""
        return self.server == "c" or self.backend.startswith("raw-")

    @property
    def label(self) -> str:
        if self.point.message == "health":
            return f"{self.backend}/{self.server}/health"
        if self.point.message == "pingpong":
            return f"{self.backend}/{self.server}"
        return f"{self.backend}/{self.server}/b{self.point.batch}"

    def us(self, p: float) -> float:
        return self.hist.percentile(p) / 1000.0

    @property
    def p50_us(self) -> float:
        return self.us(50.0)

    @property
    def round_trips_per_s(self) -> float:
        return (
            self.stats.round_trips / (self.stats.elapsed_ns / 1e9) if self.stats.elapsed_ns else 0.0
        )

    @property
    def steps_per_s(self) -> float:
        if self.point.message != "step":
            return 0.0
        return self.round_trips_per_s * self.point.batch

    def to_json(self, *, histogram: bool = True) -> dict[str, Any]:
        h = self.hist
        out: dict[str, Any] = {
            "backend": self.backend,
            "server": self.server,
            "batch": self.point.batch,
            "message": self.point.message,
            "payload_bytes": self.payload_bytes,
            "request_bytes": self.request_bytes,
            "target_bytes": self.point.target_bytes,
            "mode": self.mode,
            "rate": self.rate,
            "count": h.total,
            "warmup": self.warmup,
            "min_us": h.min / 1000.0,
            "mean_us": round(h.mean() / 1000.0, 3),
            "p50_us": self.us(50.0),
            "p90_us": self.us(90.0),
            "p99_us": self.us(99.0),
            "p999_us": self.us(99.9),
            "max_us": h.max / 1000.0,
            "steps_per_s": round(self.steps_per_s, 1),
            "round_trips_per_s": round(self.round_trips_per_s, 1),
            "ratio_to_floor": None
            if self.ratio_to_floor is None
            else float(f"{self.ratio_to_floor:.4g}"),
            "floor": self.floor_name,
            "url": self.url,
            "env": None if self.is_floor else self.env,
        }
        if self.service is not None and self.service.total:
            out["service_p50_us"] = self.service.percentile(50.0) / 1000.0
            out["service_p99_us"] = self.service.percentile(99.0) / 1000.0
        if histogram:
            out["histogram"] = h.to_json()
        return out


@dataclass
class Problem:
    backend: str
    server: str
    batch: int | None
    reason: str
    env: str | None = None  # --url: the env the server named ("unknown": none did)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "server": self.server,
            "batch": self.batch,
            "reason": self.reason,
            "env": self.env,
        }


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    floors: list[Row] = field(default_factory=list)
    skipped: list[Problem] = field(default_factory=list)
    failed: list[Problem] = field(default_factory=list)
    reference_floor: Row | None = None
    started: float = field(default_factory=time.time)
    elapsed_s: float = 0.0

    def all_rows(self) -> list[Row]:
        return self.floors + self.rows


class CellFailure(Exception):
    """A server that started broke during the probe."""


_tags = itertools.count()


def new_tag() -> str:
    return f"tprobe-{os.getpid()}-{next(_tags)}"


def socket_floor_plan(settings: Settings) -> list[tuple[str, Point]]:
    """The floors of the rows' bytes the planned rows need: (kind, point) for each socket kind
    or shm that one of the backends maps to (``FLOOR_OF_SCHEME``) and each point measured."""
    kinds = {FLOOR_OF_SCHEME.get(b, "").removeprefix("c-floor-") for b in settings.backends}
    return [
        (kind, point) for kind in BYTE_FLOOR_KINDS if kind in kinds for point in settings.points
    ]


def floor_count(settings: Settings) -> int:
    """How many floor cells ``floor_rows`` measures (progress totals)."""
    return 2 + len(socket_floor_plan(settings)) if settings.floor else 0


def floor_rows(
    settings: Settings,
    results: Results,
    progress: Progress,
    *,
    sockets_only: bool = False,
    sizes: tuple[int, int] | None = None,
) -> None:
    """The spin and futex floors, then a socket floor per socket kind and point (same bytes).
    ``sockets_only``: only the socket floors (added to floors measured before). ``sizes``:
    (result, request) bytes per env when not the reference schema's (a ``--url`` server)."""
    cells: list[tuple[str, Point | None]] = (
        [] if sockets_only else [("spin", None), ("futex", None)]
    )
    cells += socket_floor_plan(settings)
    result_size, request_size = sizes or (step_result_size(), step_request_size())
    for mode, point in cells:
        name = f"c-floor-{mode}"
        label = f"{name}/c" if point is None else f"{name}/c/{_point_tag(point)}"
        progress.begin(label)
        try:
            if point is None:
                floor = measure_floor(
                    mode, settings.count, settings.warmup, timeout=settings.timeout
                )
            elif mode == "shm":  # no frames: the actions in, the results back
                floor = measure_shm_floor(
                    point.request_bytes(request_size),
                    point.response_bytes(result_size),
                    settings.count,
                    settings.warmup,
                    timeout=settings.timeout,
                )
            else:
                floor = measure_socket_floor(
                    mode,
                    FRAME_HEADER_BYTES + point.request_bytes(request_size),
                    FRAME_HEADER_BYTES + point.response_bytes(result_size),
                    settings.count,
                    settings.warmup,
                    timeout=settings.timeout,
                )
        except FloorUnavailable as exc:
            results.skipped.append(Problem(name, "c", 1, str(exc)))
            progress.end(label, f"skipped: {exc}")
            continue
        except (RuntimeError, OSError) as exc:
            results.failed.append(Problem(name, "c", 1, str(exc)))
            progress.end(label, f"FAILED: {exc}")
            continue
        row = _floor_row(floor, point, result_size, request_size)
        results.floors.append(row)
        progress.end(row.label, _brief(row))
    for row in results.floors:
        if row.backend == REFERENCE:
            results.reference_floor = row


def raw_floor_plan(settings: Settings) -> list[tuple[str, str, Point]]:
    """The raw floors the planned rows need: (scheme, server language, point) of every step
    row whose scheme has one in that language (``RAW_SCHEMES``)."""
    if not settings.floor:
        return []
    return [
        (scheme, lang, point)
        for scheme in settings.backends
        if scheme in RAW_SCHEMES
        for lang in settings.langs
        if lang in RAW_SCHEMES[scheme]
        for point in settings.points
        if point.message == "step"
    ]


def raw_floor_rows(
    settings: Settings,
    results: Results,
    progress: Progress,
    *,
    sizes: tuple[int, int] | None = None,
) -> None:
    """Measure each raw floor of ``raw_floor_plan``: the row's bytes, a bare server of its
    language, no protocol (transport/probe/raw.py). ``sizes`` as for ``floor_rows``."""
    result_size, request_size = sizes or (step_result_size(), step_request_size())
    for scheme, lang, point in raw_floor_plan(settings):
        name = raw_name(scheme)
        label = f"{name}/{lang}/{_point_tag(point)}"
        progress.begin(label)
        reason = lang_unavailable(lang)
        if reason is not None:
            results.skipped.append(Problem(name, lang, point.batch, reason))
            progress.skip(label)
            continue
        header = 0 if scheme == "http" else FRAME_HEADER_BYTES  # http carries no frame header
        try:
            hist, stats = measure_raw(
                scheme,
                lang,
                new_tag(),
                header + point.request_bytes(request_size),
                header + point.response_bytes(result_size),
                settings.count,
                settings.warmup,
                settings.duration,
            )
        except (ServerStartError, OSError) as exc:
            results.failed.append(Problem(name, lang, point.batch, str(exc)))
            progress.end(label, f"FAILED: {exc}")
            continue
        row = Row(
            backend=name,
            server=lang,
            point=point,
            payload_bytes=point.response_bytes(result_size),
            request_bytes=point.request_bytes(request_size),
            hist=hist,
            stats=stats,
            mode="closed",
        )
        results.floors.append(row)
        progress.end(row.label, _brief(row))


def _point_tag(point: Point) -> str:
    return "health" if point.message == "health" else f"b{point.batch}"


def _floor_row(floor: FloorResult, point: Point | None, result_size: int, request_size: int) -> Row:
    return Row(
        backend=floor.backend,
        server="c",
        point=Point(1, "pingpong") if point is None else point,
        payload_bytes=4 if point is None else point.response_bytes(result_size),
        request_bytes=4 if point is None else point.request_bytes(request_size),
        hist=floor.hist,
        stats=LoopStats(floor.hist.total, floor.elapsed_ns),
        mode="closed",
    )


def _brief(row: Row) -> str:
    text = f"p50 {row.us(50):.1f} us, p99 {row.us(99):.1f} us, n={row.hist.total}"
    if row.point.message == "step":
        text += f", {row.steps_per_s:,.0f} env-steps/s"
    return text


def plan(settings: Settings) -> list[tuple[str, str, Point]]:
    return [
        (b, lang, p) for b in settings.backends for lang in settings.langs for p in settings.points
    ]


def run(settings: Settings, progress: Progress) -> Results:
    """Floors first (before any server or thread exists: they fork), then every cell."""
    results = Results()
    started = time.perf_counter()
    if settings.floor:
        floor_rows(settings, results, progress)
        raw_floor_rows(settings, results, progress)
    result_size = step_result_size()
    request_size = step_request_size()
    unavailable: dict[tuple[str, str], str] = {}
    reported: set[str] = set()  # skip reasons already printed: each is printed once
    for backend, lang, point in plan(settings):
        label = f"{backend}/{lang}/{_point_tag(point)}"
        progress.begin(label)
        reason = unavailable.get((backend, lang))
        if reason is None:
            reason = backend_unavailable(backend) or lang_unavailable(lang)
        if reason is not None:
            unavailable[(backend, lang)] = reason
            results.skipped.append(Problem(backend, lang, point.batch, reason))
            if reason in reported:
                progress.skip(label)
            else:
                reported.add(reason)
                progress.end(label, f"skipped: {reason}")
            continue
        tag = new_tag()
        url = URL_TEMPLATES[backend](tag, point.batch)
        try:
            server = ServerProcess(
                url,
                lang=lang,
                num_envs=point.batch,
                tag=tag,
                env=settings.env,
                ready_timeout=settings.ready_timeout,
            )
        except ServerStartError as exc:
            remove(leftovers(tag))
            why = f"the {lang} server does not start on {backend}://: {exc}"
            unavailable[(backend, lang)] = why
            if settings.env != "echo" and "unknown env" in str(exc):
                # tried once: the server does not know the env on any backend
                why = f"the {lang} server does not serve --env {settings.env} (yet): {exc}"
                for other in settings.backends:
                    unavailable[(other, lang)] = why
            results.skipped.append(Problem(backend, lang, point.batch, why))
            progress.end(label, f"skipped: {why}")
            continue
        try:
            row = probe_server(
                server, backend, lang, point, settings, result_size, request_size, progress, label
            )
        except (KeyboardInterrupt, SystemExit):
            server.stop()
            remove(leftovers(tag))
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if not server.alive():
                error += (
                    f" (the server exited with {server.proc.returncode}: {server.stderr_text()})"
                )
            _stop(server, backend, lang, point, results)
            results.failed.append(Problem(backend, lang, point.batch, error))
            progress.end(label, f"FAILED: {error}")
            continue
        if _stop(server, backend, lang, point, results):
            results.rows.append(row)
            progress.end(label, _brief(row))
        else:
            progress.end(label, f"FAILED: {results.failed[-1].reason}")
    apply_floor(results)
    results.elapsed_s = time.perf_counter() - started
    return results


def _stop(server: ServerProcess, backend: str, lang: str, point: Point, results: Results) -> bool:
    """Stop the server; record a failure (and clean up) if it misbehaved. True when clean."""
    problems: list[str] = []
    died_before = not server.alive()
    status = server.stop()
    if died_before:
        pass  # already reported by the caller
    elif status is None:
        problems.append("did not exit within 10 s of SIGTERM (killed)")
    elif status != 0:
        problems.append(f"exited with status {status} after SIGTERM")
    left = leftovers(server.tag)
    if left:
        remove(left)
        problems.append(f"left {', '.join(left)} behind (removed by the probe)")
    if problems and not died_before:
        results.failed.append(Problem(backend, lang, point.batch, "server " + "; ".join(problems)))
        return False
    return not problems


def probe_server(
    server: ServerProcess,
    backend: str,
    lang: str,
    point: Point,
    settings: Settings,
    result_size: int,
    request_size: int,
    progress: Progress | None = None,
    label: str = "",
) -> Row:
    row = probe_url(server.url, point, settings, result_size, request_size, progress, label)
    row.backend, row.server = backend, lang
    return row


def probe_url(
    url: str,
    point: Point | None,
    settings: Settings,
    result_size: int | None = None,
    request_size: int | None = None,
    progress: Progress | None = None,
    label: str = "",
    seen: dict[str, Any] | None = None,
) -> Row:
    """Measure one server at ``url``.

    ``point`` given: a reference server of this run (the echo env, pac_env): the point's
    request, then the echo check. ``point`` None (``--url``): any server as it is, with its
    own env count and schema (``settings.schema``, else the one it announces): the echo
    server gets the echo check, any other env a batch of legal actions (``legal_actions``)
    and server auto-reset ``next_step`` (its episodes end). ``progress``: its bar moves
    within the cell (warm-up and measurement round trips). ``seen``: filled with what the
    handshake said (``env``, ``server``, ``backend``, ``batch``) as soon as it is known, so that
    a caller can name the server in a failure."""
    from transport.api import connect
    from transport.backends import scheme_of
    from transport.protocol import body_codec

    autoreset = "disabled" if point is not None else "next_step"
    with connect(url, settings.schema, timeout=settings.timeout, autoreset=autoreset) as client:
        env = str(client.server_info.get("env") or "unknown")
        if seen is not None:
            seen.update(
                env=env,
                server=str(client.server_info.get("server", "unknown")),
                backend=scheme_of(client.url),
                batch=client.num_envs,
            )
        echo = point is not None or (settings.schema is None and _speaks_echo(client, env))
        if point is None:
            point = Point(client.num_envs)
        elif point.message == "step" and client.num_envs != point.batch:
            raise CellFailure(f"the server has {client.num_envs} envs, expected {point.batch}")
        if not echo or result_size is None or request_size is None:
            result_size = body_codec(client.schema, "STEP_RESP").size
            request_size = body_codec(client.schema, "STEP_REQ").size
        first = client.reset(seed=0)
        actions: np.ndarray | int
        if not echo and point.message == "step":
            call, actions = legal_actions(client, first)
        else:
            call, actions = _call_for(client, point)
        label = label or url

        def ticker(phase: str, total: int) -> Callable[[int], None] | None:
            return None if progress is None else progress.ticker(label, phase, total)

        warmed = warm_up(
            call,
            settings.warmup,
            int(settings.duration * 0.5e9),
            time.perf_counter_ns,
            ticker("warm-up", settings.warmup),
        )
        hist = LogHistogram()
        service: LogHistogram | None = None
        max_ns = int(settings.duration * 1e9)
        tick = ticker("measure", settings.count)
        if settings.rate is None:
            stats = closed_loop(call, settings.count, hist, max_ns=max_ns, tick=tick)
        else:
            service = LogHistogram()
            stats = open_loop(
                call, settings.count, settings.rate, hist, service, max_ns=max_ns, tick=tick
            )
        if echo:
            _check_echo(client, point, actions)
        server = str(client.server_info.get("server", "unknown"))
        chosen = client.url  # auto:// resolves to the backend it chose
    return Row(
        backend=scheme_of(chosen),
        server=server,
        point=point,
        payload_bytes=point.response_bytes(result_size),
        request_bytes=point.request_bytes(request_size),
        hist=hist,
        stats=stats,
        mode="closed" if settings.rate is None else "open",
        rate=settings.rate,
        warmup=warmed,
        service=service,
        url=chosen,
        env=env,
    )


def _speaks_echo(client: Any, env: str) -> bool:
    """The reference echo env over the reference schema: the echo check applies."""
    from transport.client import default_schema

    return env in PROBE_ENVS and client.schema.fingerprint == default_schema().fingerprint


def _call_for(client: Any, point: Point) -> tuple[Callable[[], object], np.ndarray | int]:
    if point.message == "health":
        return client.health, 0
    if point.batch == 1 and client.num_envs == 1:
        return functools.partial(client.step, 1), 1
    actions = (np.arange(point.batch, dtype=np.int64) * 7 + 1) % NUM_ACTIONS
    return functools.partial(client.step, actions), actions


def lowest_action(space: Any) -> Any:
    """A legal action of any gymnasium space, from the space's own attributes: its lowest
    value. Discrete and MultiDiscrete: ``start`` (0 where a space has none); MultiBinary: zeros;
    Box: 0 clipped into its bounds (its ``low`` where 0 is below it; an integer Box included);
    Dict and Tuple: one per member, in their structure. Another space: its ``start`` or ``low``
    when it has one, else zeros of its shape; a ``ValueError`` when it has no shape either."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {key: lowest_action(member) for key, member in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(lowest_action(member) for member in space.spaces)
    shape = getattr(space, "shape", None)
    dtype = getattr(space, "dtype", None)
    dtype = np.int64 if dtype is None else dtype  # (a numpy dtype is falsy: no ``or``)
    if isinstance(space, spaces.Box):
        zero = np.zeros(space.shape, dtype=space.dtype)
        return np.asarray(np.clip(zero, space.low, space.high), dtype=space.dtype)
    for name in ("start", "low"):
        value = getattr(space, name, None)
        if value is not None:
            return np.broadcast_to(np.asarray(value, dtype=dtype), shape or ()).copy()
    if shape is None:
        raise ValueError(f"no legal action known for the action space {space!r}")
    return np.zeros(shape, dtype=dtype)


def legal_actions(client: Any, first: Any) -> tuple[Callable[[], object], np.ndarray]:
    """Steps for any server: one batch of N actions shaped ``(N, *action_shape)`` in the action
    field's dtype, from the server's discovered spaces (``transport.spaces``), so no step is
    refused. Discrete: each env's first legal action under its current mask (action 0 without
    an ``action_mask`` role), one argmax per step, no allocation; any other space (a
    MultiDiscrete, a MultiBinary, a Box of floats or integers, a Discrete with a start, the
    gymnasium space a ``--gym`` server describes): its ``lowest_action``. The batch form is
    valid for any env count, 1 included."""
    from transport.protocol import body_codec
    from transport.spaces import DISCRETE, action_field_of, action_kind_of, action_space_of

    schema = client.schema
    field = action_field_of(schema)
    dtype = client.action_dtype
    n = client.num_envs
    kind = action_kind_of(field)
    if kind == DISCRETE:
        actions = np.zeros(n, dtype=dtype)
        mask = body_codec(schema, "STEP_RESP").ir.role("action_mask")
        if mask is None:
            return functools.partial(client.step, actions), actions
        legal = np.zeros(n, dtype=np.intp)

        def choose(view: Any) -> None:
            np.argmax(np.asarray(view[mask.name]).reshape(n, -1) != 0, axis=1, out=legal)
            actions[:] = legal

        choose(first)
        return (lambda: choose(client.step(actions))), actions
    space: Any = action_space_of(schema, client.spaces().act_n)
    one = lowest_action(space)
    if not isinstance(one, np.ndarray):
        raise CellFailure(f"the action field {field.name} holds one array, not {space!r}")
    if one.size == int(np.prod(field.dims)):  # a space of shape () in a field of one element
        one = one.reshape(field.dims)
    actions = np.ascontiguousarray(np.broadcast_to(one, (n, *field.dims)), dtype=dtype)
    return functools.partial(client.step, actions), actions


def _check_echo(client: Any, point: Point, actions: np.ndarray | int) -> None:
    """One more round trip whose answer must follow the echo env's contract (obs[0] = action)."""
    if point.message == "health":
        if not client.health():
            raise CellFailure("the server reports itself unhealthy")
        return
    if isinstance(actions, int):
        probe = 3
        got = client.step(probe).observation[0]
        if int(got) != probe:
            raise CellFailure(f"wrong echo: observation[0] = {got}, expected {probe}")
        return
    probe_actions = (actions + 3) % NUM_ACTIONS
    got_arr = np.asarray(client.step(probe_actions).observation)[:, 0]
    if not np.array_equal(got_arr.astype(np.int64), probe_actions):
        raise CellFailure("wrong echo: observation[:, 0] differs from the actions sent")


def waits_by_spinning(row: Row) -> bool:
    """Whether a shared-memory row's waiter spins before it sleeps (its URL's wait policy: the
    default ``balanced`` and ``spin`` do, ``futex`` or ``spin=0`` sleeps at once)."""
    from transport.backends.shm.region import parse_url

    try:
        return parse_url(row.url).wait.spin > 0 if row.url else True
    except Exception:  # not an shm:// URL: it waits in the kernel
        return False


def floor_for(row: Row, floors: Sequence[Row]) -> Row | None:
    """The floor ``row`` is compared with: for a socket row the raw floor of its scheme and
    server language at the same point (transport/probe/raw.py), else the C socket floor of its
    scheme (``FLOOR_OF_SCHEME``) at the same point; for shared memory the shm floor of its
    bytes when the row waits by spinning (the 4-byte spin floor where that one is missing), the
    futex floor when it sleeps; for anything else the futex floor."""
    raw = raw_name(row.backend)
    for f in floors:
        if (f.backend, f.server, f.point.batch, f.point.message) == (
            raw,
            row.server,
            row.point.batch,
            row.point.message,
        ):
            return f
    return c_floor_for(row, floors)


def c_floor_for(row: Row, floors: Sequence[Row]) -> Row | None:
    """The C floor of ``row``'s kind (no raw floor): the spin or futex floor for shared memory
    as the row waits, the C socket floor of its scheme at the same point, else the futex
    floor. The figures draw these: a few per batch, where the raw floors are one per scheme
    and language."""
    name = FLOOR_OF_SCHEME.get(row.backend, REFERENCE)
    if name == "c-floor-shm":
        if not waits_by_spinning(row):
            name = REFERENCE
        elif not any(
            f.backend == name
            and (f.point.batch, f.point.message) == (row.point.batch, row.point.message)
            for f in floors
        ):
            name = "c-floor-spin"  # no floor of its bytes (a health row, --no-floor sizes)
    same_point = [
        f
        for f in floors
        if f.backend == name
        and (f.point.batch, f.point.message) == (row.point.batch, row.point.message)
    ]
    named = [f for f in floors if f.backend == name]
    reference = [f for f in floors if f.backend == REFERENCE]
    for candidates in (same_point, named, reference):
        if candidates:
            return candidates[0]
    return None


def apply_floor(results: Results) -> None:
    """``ratio_to_floor`` of every measured row against the floor that applies to it."""
    for row in results.rows:
        floor = floor_for(row, results.floors)
        if floor is None or floor.p50_us <= 0:
            continue
        row.floor_name = floor.backend
        row.ratio_to_floor = row.p50_us / floor.p50_us
