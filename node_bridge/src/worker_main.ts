/** The entry point of a WorkerPool thread (workers.ts): steps its envs until the pool closes. */

import { workerData } from "node:worker_threads";
import { runWorker } from "./workers";

runWorker(workerData as Parameters<typeof runWorker>[0]);
