/**
 * URL query parameters, read once for every backend: a parameter given twice is refused
 * (transport/backends/url_params.py says the same). `URLSearchParams` keeps both values of
 * `?heartbeat=1&heartbeat=0` and each backend would pick one silently; a URL that says two
 * things is a mistake, so it is a `ConnectError` naming the parameter.
 */

import { ConnectError } from "../errors";

/** The parameters of `query` (the text after `?`), each given at most once. */
export function singleParams(url: string, query: string): Map<string, string> {
  const params = new Map<string, string>();
  for (const [key, value] of new URLSearchParams(query)) {
    if (params.has(key)) {
      throw new ConnectError(`${JSON.stringify(url)}: parameter ${JSON.stringify(key)} is given more than once`);
    }
    params.set(key, value);
  }
  return params;
}
