/**
 * The contract env in a worker thread (`transport-serve URL --env contract --lang node --workers
 * K`): a worker builds its envs from a module export, and the contract env needs the schema,
 * which the worker's spec names (`schemaModule`, the path `--schema` resolved to).
 */

import { workerData } from "node:worker_threads";

import { schemaFromPath } from "../runtime/pool";
import { ContractEnv } from "./contract";

/** A ContractEnv of the schema this worker thread was started with. */
export function contract(): ContractEnv {
  const spec = (workerData as { spec?: { schemaModule?: string } } | null)?.spec;
  if (spec?.schemaModule === undefined) throw new Error("the contract env needs the worker's schemaModule (--schema)");
  return new ContractEnv(schemaFromPath(spec.schemaModule));
}
