/**
 * The admin token a local `tollgate serve` makes when none is configured, as the `tollgate`
 * commands find it: `TOLLGATE_ADMIN_TOKEN`, else the copy the server keeps for its user at
 * `$XDG_STATE_HOME/tollgate/servers/PORT.admin-token` (default `~/.local/state`), sent only to
 * the server that wrote it and refused when others could have read or written it.
 */

import { readFileSync, statSync } from "node:fs";
import { isIP } from "node:net";
import { isAbsolute, join } from "node:path";

/** Where the server listening on `port` keeps its token for this user's programs. */
export function userCopyPath(port: number): string | undefined {
  let state = process.env["XDG_STATE_HOME"] ?? "";
  if (!isAbsolute(state)) {
    const home = process.env["HOME"] ?? "";
    if (!isAbsolute(home)) {
      return undefined;
    }
    state = join(home, ".local", "state");
  }
  return join(state, "tollgate", "servers", `${port}.admin-token`);
}

const isLoopback = (ip: string): boolean => ip === "::1" || (isIP(ip) === 4 && ip.startsWith("127."));
const isUnspecified = (ip: string): boolean => ip === "0.0.0.0" || ip === "::";

/** `http(s)://HOST:PORT/...` as [host, port]; the port defaults to the scheme's. */
function hostPort(url: string): [string, number] | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return undefined;
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    return undefined;
  }
  const host = parsed.hostname.replace(/^\[|\]$/g, "");
  const port = parsed.port === "" ? (parsed.protocol === "https:" ? 443 : 80) : Number(parsed.port);
  return [host, port];
}

/**
 * Whether a token whose server listens on `listen` may be sent to `url`: only to that server,
 * at its own port over loopback or at the exact address it listens on.
 */
export function belongsTo(listen: string | null | undefined, url: string): boolean {
  const found = hostPort(url);
  return listen !== null && listen !== undefined && found !== undefined && listensAt(listen, ...found);
}

/** Whether a server listening on `listen` (`ADDRESS:PORT`) is the one at `host`:`port`. */
function listensAt(listen: string, host: string, port: number): boolean {
  const colon = listen.lastIndexOf(":");
  const bound = listen.slice(0, colon).replace(/^\[|\]$/g, "");
  if (colon < 0 || Number(listen.slice(colon + 1)) !== port || isIP(bound) === 0) {
    return false;
  }
  if (host.toLowerCase() === "localhost") {
    return isLoopback(bound) || isUnspecified(bound);
  }
  return host === bound || (isLoopback(host) && isUnspecified(bound));
}

/** The admin token for the server at `url`, as the `tollgate` commands find it. */
export function keptAdminToken(url: string): string | undefined {
  const given = process.env["TOLLGATE_ADMIN_TOKEN"];
  if (given) {
    return given;
  }
  const found = hostPort(url);
  if (found === undefined) {
    return undefined;
  }
  const path = userCopyPath(found[1]);
  if (path === undefined) {
    return undefined;
  }
  let text: string;
  let mode: number;
  let owner: number;
  try {
    const info = statSync(path);
    mode = info.mode & 0o777;
    owner = info.uid;
    text = readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
  if ((mode & 0o077) !== 0 || (process.getuid !== undefined && owner !== process.getuid())) {
    throw new Error(
      `admin token file ${path} could have been read or planted by another user (mode ` +
        `${mode.toString(8)}, owner ${owner}); make it 0600 and yours, or remove it`,
    );
  }
  const lines = text
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "");
  const listens = lines.slice(1).filter((line) => line.startsWith("listen "));
  const listen = listens.at(-1)?.slice("listen ".length).trim();
  if (lines[0] === undefined || listen === undefined || !belongsTo(listen, url)) {
    return undefined;
  }
  return lines[0];
}
