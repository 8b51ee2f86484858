"""The env runtime: every env semantic once, driven by every backend's server.

- ``env``: the Env interface (``Env``, ``Spaces``, ``EnvFactory``, ``StepOutput``);
- ``core``: ``EnvRuntime`` (the rules), ``Runner`` (where envs run), ``EnvHost`` (what a
  server serves: one runtime per client);
- ``local``: ``LocalEnvs``, the in-process runner (results written in place);
- ``pool``: ``WorkerPool``, the worker-process runner;
- ``session``: ``Session``, the stream protocol's request handling over a runtime.
"""

from __future__ import annotations

from transport.runtime.core import EnvRuntime, Runner
from transport.runtime.env import Env, EnvFactory, Spaces, StepOutput
from transport.runtime.host import EnvHost

__all__ = ["Env", "EnvFactory", "EnvHost", "EnvRuntime", "Runner", "Spaces", "StepOutput"]
