/** The entry point of a WorkerPool thread (pool.ts): runs its envs' operations until the pool closes. */

import { workerData } from "node:worker_threads";
import { runWorker } from "./pool";

runWorker(workerData as Parameters<typeof runWorker>[0]);
