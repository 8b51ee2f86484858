"""transport.testing: the backend contract suite, written once, runnable against any backend.

The behaviour every backend and server language must share (handshake, typed errors, seeds,
auto-reset modes, batches, env errors, dead and silent peers, signal cleanup, bad input) as
named checks over a deterministic env, the way trio ships its stream checks (docs/testing.md):

    from transport.testing import contract_checks, serve_process_factory, ServerPool, run_check
    pool = ServerPool(serve_process_factory("unix", "python"))
    for name in contract_checks():
        run_check(name, pool, schema_named("pac_env"))
    pool.close()
"""

# the modules that register contract checks (imported by name: `import transport.testing.x`
# would bind `transport` in this package's public names)
from transport.testing import (  # noqa: F401
    checks_async,
    checks_collector,
    checks_discovery,
    checks_edges,
    checks_fuzz,
    checks_limits,
    checks_shapes,
    checks_timeouts,
    gymapi_checks,
)
from transport.testing.checks import (
    CHECKS,
    Check,
    CheckContext,
    NotApplicable,
    contract_checks,
    run_check,
)
from transport.testing.contract_env import (
    POISON_ACTION,
    TRUNCATE_AT,
    ContractEnv,
    PoisonActionError,
    contract_factory,
    contract_spaces,
    schema_named,
)
from transport.testing.model import ExpectedSession
from transport.testing.parametrize import (
    Case,
    Gaps,
    PoolsByCase,
    contract_cases,
    gap_reason,
    unused_gaps,
)
from transport.testing.servers import (
    CONTRACT_MAX_BODY,
    SCHEMES,
    SERVER_SEED,
    RunningServer,
    ServeProcess,
    ServerFactory,
    ServerOptions,
    ServerPool,
    serve_process_factory,
    unique_url,
)

__all__ = [
    "CHECKS",
    "CONTRACT_MAX_BODY",
    "POISON_ACTION",
    "SCHEMES",
    "SERVER_SEED",
    "TRUNCATE_AT",
    "Case",
    "Check",
    "CheckContext",
    "ContractEnv",
    "ExpectedSession",
    "Gaps",
    "NotApplicable",
    "PoisonActionError",
    "PoolsByCase",
    "RunningServer",
    "ServeProcess",
    "ServerFactory",
    "ServerOptions",
    "ServerPool",
    "contract_cases",
    "contract_checks",
    "contract_factory",
    "contract_spaces",
    "gap_reason",
    "run_check",
    "schema_named",
    "serve_process_factory",
    "unique_url",
    "unused_gaps",
]
