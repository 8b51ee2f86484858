/**
 * The reference envs a Node server hosts by name (`transport-serve --env NAME --lang node`):
 * the same names as the Python registry (transport/envs/__init__.py).
 */

import type { StepResultInput } from "../generated/pac_env";
import type { EnvFactory, VectorEnvClass } from "../runtime/env";
import { EchoEnv } from "./echo";
import { FramesEnv } from "./frames";
import { HeavyTailEnv } from "./heavy_tail";
import { MahjongEnv } from "./mahjong";
import { PacEnv } from "./pac";
import { LockEnv, ReachEnv } from "./rich_spaces";
import { VectorEchoEnv } from "./vector_echo";

export { EchoEnv } from "./echo";
export { FramesEnv } from "./frames";
export { HeavyTailEnv } from "./heavy_tail";
export { MahjongEnv } from "./mahjong";
export { PacEnv } from "./pac";
export { LockEnv, ReachEnv } from "./rich_spaces";

export const ENVS: Record<string, EnvFactory<StepResultInput> | EnvFactory<unknown>> = {
  echo: () => new EchoEnv(),
  pac: () => new PacEnv(),
  mahjong: () => new MahjongEnv(), // four seats taking turns (schema mahjong_env)
  reach: () => new ReachEnv(), // Dict observation, Box action (schema dictbox)
  lock: () => new LockEnv(), // MultiDiscrete action (schema multidiscrete)
  frames: () => new FramesEnv(), // decision-boundary runs (schema frames)
  heavy_tail: () => new HeavyTailEnv(), // heavy-tailed step times (asynchronous batches)
};

export { EpisodicVectorEchoEnv, VectorEchoEnv } from "./vector_echo";

/**
 * The reference vector envs by name (`transport-serve --env vector-echo --num-envs N --lang
 * node`): a class the server makes with `new C(N)` per client, all N envs stepped in one call.
 * Apart from `ENVS` because they are not one-env factories (a worker pool or `env_trace`
 * cannot use them). Python: the same names in transport/envs/__init__.py.
 */
export const VECTOR_ENVS: Readonly<Record<string, VectorEnvClass>> = {
  "vector-echo": VectorEchoEnv, // the echo env, N at a time (pac_env)
};

/** The schema a reference env speaks when it is not pac_env (as Python's SCHEMAS). */
export const ENV_SCHEMAS: Readonly<Record<string, string>> = {
  reach: "dictbox",
  lock: "multidiscrete",
  mahjong: "mahjong_env",
  frames: "frames",
};
