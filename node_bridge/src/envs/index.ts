/**
 * The reference envs a Node server hosts by name (`transport-serve --env NAME --lang node`):
 * the same names as the Python registry (transport/envs/__init__.py).
 */

import type { StepResultInput } from "../generated/pac_env";
import type { EnvFactory } from "../runtime/env";
import { EchoEnv } from "./echo";
import { PacEnv } from "./pac";

export { EchoEnv } from "./echo";
export { PacEnv } from "./pac";

export const ENVS: Record<string, EnvFactory<StepResultInput>> = {
  echo: () => new EchoEnv(),
  pac: () => new PacEnv(),
};
