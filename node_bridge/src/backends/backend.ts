/**
 * What a backend is (`Backend`: `listen` and `openChannel`) and the options every backend
 * understands. The registry (`./index`) loads the backends; each backend imports these types
 * from here, so no backend imports the registry that loads it.
 */

import type { SchemaModule } from "../codec";
import type { EnvHost } from "../runtime/host";
import type { Channel, ChannelOptions, ConnectionStats, ServerLimits } from "../stream";

/** The most envs one server serves per connection (or per shm region); clients refuse more. */
export const MAX_NUM_ENVS = 65536;

/** Server-side options every backend understands. */
export interface ListenOptions {
  /** Largest request body accepted (bytes); larger ones are refused before they are read. */
  readonly maxBody?: number;
  /** http: bind a non-loopback address (the protocol has no authentication). */
  readonly allowRemote?: boolean;
  /** unix, http: the connection cap and timeouts; zmq: the idle timeout of a session (defaults: DEFAULT_SERVER_LIMITS). */
  readonly limits?: Partial<ServerLimits>;
}

/** A listening server endpoint. */
export interface Listener {
  /** The URL clients use (a requested port 0 is resolved). */
  readonly url: string;
  readonly stats: ConnectionStats;
  /** Stop accepting, drop every connection, remove what was created (socket files). */
  close(): Promise<void>;
}

/** Client-side options every backend understands. */
export interface OpenOptions extends ChannelOptions {
  readonly schema?: SchemaModule;
}

export interface Backend {
  listen(url: string, host: EnvHost, options?: ListenOptions): Promise<Listener>;
  openChannel(url: string, options?: OpenOptions): Promise<Channel>;
}
