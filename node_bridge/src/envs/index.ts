/**
 * The reference envs a Node server hosts by name (`transport-serve --env NAME --lang node`):
 * the same names as the Python registry (transport/envs/__init__.py).
 */

import type { EnvFactory } from "../env";
import { EchoEnv } from "./echo";
import { PacEnv } from "./pac";

export { EchoEnv } from "./echo";
export { PacEnv } from "./pac";

export const ENVS: Record<string, EnvFactory> = {
  echo: () => new EchoEnv(),
  pac: () => new PacEnv(),
};
