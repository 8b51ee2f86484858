/**
 * The env runtime (`@transport/node-bridge/runtime`): what a user's own env server is made of.
 * `EnvRuntime` holds every env semantic; `EnvHost` makes one per client; the stream `Session`
 * and the runners (in this thread, or worker threads) are what the backends drive.
 */

export {
  EnvRuntime,
  FATE_FAILED,
  FATE_RECREATED,
  FATE_RESET,
  Op,
  type Failure,
  type Records,
  type Runner,
  type RuntimeOptions,
} from "./core";
export {
  type Column,
  type Env,
  type EnvFactory,
  type EnvOrFactory,
  type ResultRow,
  type Spaces,
  type VectorEnv,
  type VectorEnvClass,
  type VectorResults,
  isEnv,
} from "./env";
export { EnvHost, type HostOptions } from "./host";
export { EnvTable, LocalRunner } from "./local";
export { PoolRunner, WorkerPool, type WorkerEnvSpec } from "./pool";
export { Session, sessionFactory, sessionsOf } from "./session";
