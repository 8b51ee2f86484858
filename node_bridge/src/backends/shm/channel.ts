/** The shm:// client channel (Client <-> a region's slots). */

import { ConnectError } from "../../errors";
import type { Channel } from "../../stream";
import type { OpenOptions } from "../index";
import { parseShmUrl } from "./region";

/** The Node side serves shm:// regions; the client is Python's (transport.connect). */
export async function openChannel(url: string, _options: OpenOptions = {}): Promise<Channel> {
  parseShmUrl(url);
  throw new ConnectError(
    `${url}: the Node library serves shm:// regions but has no shm:// client; connect from Python ` +
      "(transport.connect) or use unix:// / http:// from Node",
  );
}
