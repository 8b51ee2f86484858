"""``EnvHost``: what a server serves (the env or its factory, how many, where they run); makes
one ``EnvRuntime`` per client over the record views the backend hands it, with the runner the
setup asks for (``LocalEnvs``, ``WorkerPool`` or ``VectorEnvs``). It sits above the runtime and
the runners, which never import it."""

from __future__ import annotations

import functools
import pickle
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from transport.codec import Schema
from transport.errors import ProtocolError
from transport.protocol import body_codec
from transport.runtime.core import (
    ACTION_CODES,
    FLOAT_ACTION_TYPES,
    ActionRule,
    EnvRuntime,
    ProgressWatchdog,
    Runner,
    action_dtype,
    check_masked_actions,
    describe,
    penalty_of,
)
from transport.runtime.env import (
    SERVE_THE_OBJECT,
    Env,
    EnvFactory,
    Served,
    Spaces,
    check_declared_action,
    close_env,
    is_vector_env,
    repeated_env_error,
    spaces_of,
)


def refuse_other_schema(schema: Schema, served: Any) -> None:
    """Refuse, at start, an env (its class, factory, or the env a factory made) whose ``SCHEMA``
    attribute is a schema other than the one served: its results follow its own layout, and
    every reset would fail with "returned bad values". ``ValueError`` naming both schemas."""
    target = served
    while isinstance(target, functools.partial):
        target = target.func
    for obj in [served] if target is served else [served, target]:
        try:
            declared = getattr(obj, "SCHEMA", None)
        except Exception:  # an attribute proxy (a wrapper's __getattr__) that refuses the name
            continue
        if not isinstance(declared, Schema) or declared.fingerprint == schema.fingerprint:
            continue
        name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        raise ValueError(
            f"cannot serve {name}: it declares schema {declared.name} "
            f"(fp {declared.fingerprint:016x}) in {name}.SCHEMA, but the server was given "
            f"schema {schema.name} (fp {schema.fingerprint:016x}): its results follow its own "
            "schema and every reset would fail; serve it with the schema it declares, "
            f"or make {name}.SCHEMA the schema it now follows"
        )


class EnvHost:
    """The envs a server serves: one ``EnvRuntime`` per client over record views it is given.

    ``env_or_factory``: an env instance (one env, shared by every client under a lock) or a
    zero-argument factory (each client gets ``num_envs`` fresh envs). ``workers`` > 0 runs each
    client's envs in that many worker processes (``transport.runtime.pool``). A setup the
    server cannot serve is refused here, when the server starts, with the reason.
    """

    def __init__(
        self,
        schema: Schema,
        env_or_factory: Served,
        *,
        num_envs: int = 1,
        env_name: str = "",
        server_lang: str = "python",
        seed: int | None = None,
        workers: int = 0,
        masked_actions: str = "reject",
        step_timeout: float | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        self.masked_actions = check_masked_actions(masked_actions)
        self._penalty: float | None = None  # the envs' penalty, asked of one env (worker pools)
        self._spaces: Spaces | None = None  # the envs' spaces, asked at start (worker pools)
        if workers < 0:
            raise ValueError("workers must be 0 (in-process) or more")
        if step_timeout is not None and not step_timeout > 0:
            raise ValueError(f"step_timeout must be positive seconds, not {step_timeout!r}")
        self.step_timeout = step_timeout  # a worker pool's per-op deadline (None: its default)
        self.schema = schema
        self.num_envs = num_envs
        self.env_name = env_name
        self.server_lang = server_lang
        self.seed = seed
        self.workers = workers  # > 0: each client's envs run in that many worker processes
        self.result = body_codec(schema, "STEP_RESP")
        # a noop's reward is the env's penalty: checked against the reward field it goes to
        self._noop_reward = self.result.ir.role("reward") if self.masked_actions == "noop" else None
        self.step_request = body_codec(schema, "STEP_REQ")
        action = self.step_request.ir.role("action")
        if action is None:
            raise ProtocolError("the STEP_REQ body struct has no field with role 'action'")
        self.action_rule = rule = ActionRule(action)
        carried = action.elem in ACTION_CODES and action.count == 1
        if rule.kind != "discrete":
            carried = action.elem in FLOAT_ACTION_TYPES or action.elem in ACTION_CODES
        if not carried:
            raise ProtocolError(
                f"this server cannot carry the action {self.step_request.ir.name}.{action.name}: "
                f"{action.type} (one integer, an integer array or an f32/f64 array per env)"
            )
        self.action = action
        # [env] seats, not the multi request field's element count (8 seats of f32[3] is 24)
        env_ir = schema.ir.env
        self.seats = (
            env_ir.seats
            if env_ir is not None
            else body_codec(schema, "STEP_MULTI_REQ").ir.fields[0].count
        )
        refuse_other_schema(schema, env_or_factory)
        self.vector: bool | None = None  # a VectorEnv (one object, N envs); None: not known yet
        self._shared: Any = None  # an Env or a VectorEnv instance, shared by every client
        self.factory: EnvFactory | None = None
        self._lock: threading.Lock | None = None
        self._first: Any = None  # the env check() made, kept for the first client's envs
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()  # envs the factory returned
        if is_vector_env(env_or_factory):
            self.vector = True
            self._shared = env_or_factory
            self._lock = threading.Lock()
            self._check_vector(env_or_factory)
        elif not isinstance(env_or_factory, type) and isinstance(env_or_factory, Env):
            if num_envs != 1:
                raise ValueError("pass an env factory to serve more than one env")
            if workers:
                raise ValueError("pass an env factory to run envs in worker processes")
            self._shared = env_or_factory
            self._lock = threading.Lock()
        else:
            # an env factory, or a vector env factory (``check`` / ``create_envs`` tell)
            self.factory = cast(EnvFactory, env_or_factory)
            if workers:
                try:
                    pickle.dumps(env_or_factory)
                except Exception as exc:
                    raise ValueError(
                        f"workers={workers} needs an env factory that can be pickled (it is sent "
                        f"to each worker process): {describe(exc)}; use a module-level class or "
                        "function, or functools.partial of one"
                    ) from None

    def _check_vector(self, env: Any) -> None:
        """What a vector env (``VectorEnv``) cannot be served with, refused at start."""
        if self.workers:
            raise ValueError(
                "a vector env steps its envs itself: serve it with workers=0 (worker processes "
                "are for one-env-per-object envs)"
            )
        if env.num_envs != self.num_envs:
            raise ValueError(
                f"the vector env has num_envs={env.num_envs}; serve it with num_envs="
                f"{env.num_envs} (shm: ?num_envs={env.num_envs}), not {self.num_envs}"
            )
        subsets = bool(getattr(env, "steps_subsets", True))
        if not subsets and not getattr(env, "autoreset_next_step", False):
            raise ValueError(
                "a vector env that steps only all its envs together (steps_subsets=False) must "
                "reset ended envs itself (autoreset_next_step=True): NEXT_STEP steps the others"
            )
        if not subsets and self.masked_actions == "noop":
            raise ValueError(
                "masked_actions='noop' leaves masked envs unstepped; this vector env steps all "
                "its envs together (steps_subsets=False): use 'reject' or 'pass'"
            )

    def check(self, inspect: Callable[[Any], None] | None = None) -> None:
        """Make one env and ask its spaces, now: a factory that cannot make an env fails when
        the server starts, with the reason, not at every client's connection. The env made is
        kept for the first client (a vector env of processes is not started twice); ``inspect``
        (the default schema's check) runs on it, not a vector env, and may raise."""
        try:
            env = self._shared if self._shared is not None else self._make_env()
        except Exception as exc:
            raise ValueError(
                f"cannot serve these envs: making one failed: {describe(exc)}"
            ) from exc
        if self._shared is None:  # the env a factory made may declare its schema itself
            try:
                refuse_other_schema(self.schema, env)
            except ValueError:
                close_env(env)
                raise
        try:
            self._spaces = spaces_of(env)
            check_declared_action(self._spaces, self.schema)
            self._penalty = penalty_of(env, self._noop_reward)
        except Exception as exc:
            if self._shared is None:
                close_env(env)
            raise ValueError(f"cannot serve these envs: {describe(exc)}") from exc
        keep = False
        try:
            if self.vector is None:
                self.vector = is_vector_env(env)
            if self.vector:
                self._check_vector(env)
            elif inspect is not None:
                inspect(env)
            keep = self._shared is None and (self.vector or not self.workers)
        finally:
            if keep:
                self._first = env
            elif self._shared is None:
                close_env(env)

    def _make_env(self) -> Any:
        """One env from the factory, refused when it is an object the factory returned before:
        the server closes the envs it made when their client leaves, so a factory that returns
        one object made beforehand would hand the next client a closed env."""
        assert self.factory is not None
        env = self.factory()
        try:
            again = env in self._made
            self._made.add(env)
        except TypeError:  # not weakly referenceable or not hashable: not tracked
            return env
        if again:
            name = getattr(self.factory, "__qualname__", None) or type(self.factory).__qualname__
            raise repeated_env_error(name, type(env).__qualname__, SERVE_THE_OBJECT)
        return env

    def create_envs(self) -> list[Env]:
        """A new client's envs (none here when they live in worker processes; one object for
        a vector env)."""
        if self.factory is not None and self.workers and not self.vector:
            return []
        if self.factory is not None:
            first, self._first = self._first, None
            if first is None:
                first = self._make_env()
            if self.vector is None:  # check() was not called: the first env says
                self.vector = is_vector_env(first)
                if self.vector:
                    self._check_vector(first)
            if self.vector:
                return [first]
            envs = [first]
            try:
                envs.extend(self._make_env() for _ in range(self.num_envs - 1))
            except BaseException:
                for env in envs:
                    close_env(env)
                raise
            return envs
        assert self._shared is not None
        return [self._shared]

    def close(self) -> None:
        """Close the env kept from ``check()`` if no client took it (the server is closing)."""
        first, self._first = self._first, None
        if first is not None:
            close_env(first)

    def rows(self, envs: Sequence[Env]) -> int:
        """Result rows a client needs: ``num_envs``, or the seats of one env with step_batch."""
        if self.vector:
            return self.num_envs
        if len(envs) == 1 and getattr(envs[0], "step_batch", None) is not None:
            return max(self.num_envs, self.seats)
        return self.num_envs

    def runtime(
        self, envs: list[Env], results: np.ndarray, finals: np.ndarray | None
    ) -> EnvRuntime:
        """An ``EnvRuntime`` for ``envs`` (from ``create_envs``) writing into ``results`` (an
        (R,) record array, R = ``rows(envs)``) and SAME_STEP finals into ``finals`` ((N,))."""
        runner: Runner
        if self.vector or (self.vector is None and envs and is_vector_env(envs[0])):
            from transport.runtime.vector import VectorEnvs

            self._check_vector(envs[0])
            runner = VectorEnvs(
                envs[0],
                self.result,
                results,
                finals,
                action_dtype(self.schema),
                owned=self._shared is None,
            )
        elif self.workers:
            from transport.runtime.pool import WorkerPool

            assert self.factory is not None
            runner = WorkerPool(
                self.factory,
                self.schema,
                self.result.ir.name,
                self.num_envs,
                self.workers,
                results,
                finals,
                spaces=self._spaces,
                step_timeout=self.step_timeout,
            )
        else:
            from transport.runtime.local import LocalEnvs

            remake = self._make_env if self.factory is not None else None
            runner = LocalEnvs(envs, self.result, results, finals, remake)
        penalties = None
        if self.masked_actions == "noop" and self.workers:  # the envs live in the workers
            if self._penalty is None:
                assert self.factory is not None
                env = self.factory()
                self._penalty = penalty_of(env, self._noop_reward)
                close_env(env)
            penalties = [self._penalty] * self.num_envs
        elif self.masked_actions == "noop" and not self.vector:
            penalties = [penalty_of(env, self._noop_reward) for env in envs]
        elif self.masked_actions == "noop":  # a vector env: one penalty for its N envs
            penalties = [penalty_of(envs[0], self._noop_reward)] * self.num_envs
        runtime = EnvRuntime(
            runner,
            seats=self.seats,
            first_seed=self.seed,
            lock=self._lock,
            action=self.action,
            masked_actions=self.masked_actions,
            penalties=penalties,
        )
        runtime.watchdog = ProgressWatchdog.of(self.schema, results)
        return runtime
