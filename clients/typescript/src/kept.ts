/**
 * The admin token a local `tollgate serve` makes when none is configured, as the `tollgate`
 * commands find it: `TOLLGATE_ADMIN_TOKEN`, else the copy the server keeps for its user at
 * `$XDG_STATE_HOME/tollgate/servers/PORT.admin-token` (default `~/.local/state`), refused when
 * others could have read or written it. A kept token is sent only to the server that wrote it:
 * at the address it recorded (never where a name such as `localhost` leads now), and only once
 * the server there has proved it holds it (`GET /v1/admin-token/proof`). The proof's constants
 * are the server's (`tollgate_server::admin_proof`), held alike by
 * `crates/cli/tests/vectors/kept_token.json`.
 */

import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
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

/** The endpoint where a server proves it holds the admin token. */
export const PROOF_PATH = "/v1/admin-token/proof";
/** Its query parameter for the nonce. */
export const PROOF_NONCE_PARAMETER = "nonce";
/** What the proof's key is derived under. */
export const PROOF_LABEL = "tollgate admin-token proof v1";

/**
 * The proof, in hex, that the holder of `token` listening on `listen` answers to `nonce`:
 * HMAC-SHA256 of `listen`, a newline and `nonce`, keyed by HMAC-SHA256 of the label keyed by
 * the token.
 */
export function proof(token: string, listen: string, nonce: string): string {
  const key = createHmac("sha256", token).update(PROOF_LABEL).digest();
  return createHmac("sha256", key).update(`${listen}\n${nonce}`).digest("hex");
}

/** A fresh nonce: 32 random bytes in hex. */
export function proofNonce(): string {
  return randomBytes(32).toString("hex");
}

/** Whether `answer` (the proof endpoint's JSON) proves `token` for `listen` and `nonce`, compared in constant time. */
export function proved(token: string, listen: string, nonce: string, answer: unknown): boolean {
  const given = typeof answer === "object" && answer !== null ? (answer as Record<string, unknown>)["proof"] : undefined;
  if (typeof given !== "string") {
    return false;
  }
  const expected = Buffer.from(proof(token, listen, nonce));
  const offered = Buffer.from(given);
  return offered.length === expected.length && timingSafeEqual(offered, expected);
}

/** Where to reach the server that recorded `listen`: that address as written, loopback for one bound to all addresses. */
export function connectAddress(listen: string): string | undefined {
  const colon = listen.lastIndexOf(":");
  const port = listen.slice(colon + 1);
  let bound = listen.slice(0, colon).replace(/^\[|\]$/g, "");
  if (colon < 0 || !/^[0-9]+$/.test(port) || isIP(bound) === 0) {
    return undefined;
  }
  if (isUnspecified(bound)) {
    bound = isIP(bound) === 6 ? "::1" : "127.0.0.1";
  }
  return isIP(bound) === 6 ? `[${bound}]:${port}` : `${bound}:${port}`;
}

/** `url` with its host and port replaced by the address the server recorded, or `undefined` when the token does not belong to `url`. */
export function baseFor(listen: string | null | undefined, url: string): string | undefined {
  if (listen === null || listen === undefined || !belongsTo(listen, url)) {
    return undefined;
  }
  const connect = connectAddress(listen);
  const separator = url.indexOf("://");
  if (connect === undefined || separator < 0) {
    return undefined;
  }
  const rest = url.slice(separator + 3);
  const ends = ["/", "?", "#"].map((character) => rest.indexOf(character)).filter((index) => index >= 0);
  const end = ends.length === 0 ? rest.length : Math.min(...ends);
  return `${url.slice(0, separator)}://${connect}${rest.slice(end)}`;
}

/** A kept token that belongs to a URL: where it was read, and where to send it. */
export interface KeptToken {
  token: string;
  listen: string;
  path: string;
  /** The URL to send it to: the asked one with the recorded address in place of its host. */
  base: string;
}

/** What a client says when it does not send `kept`. */
export function refusal(kept: KeptToken, why: string): string {
  return (
    `not sending the admin token kept in ${kept.path}: the server at ${kept.base} did not prove that it ` +
    `holds it (${why}); the file may be left by a server that has stopped, and another program may listen ` +
    "on its port"
  );
}

/** `TOLLGATE_ADMIN_TOKEN`, sent wherever the client is told. */
export function givenAdminToken(): string | undefined {
  return process.env["TOLLGATE_ADMIN_TOKEN"] || undefined;
}

/**
 * The token a local server keeps for this user that belongs to the server at `url`, as the
 * `tollgate` commands find it; the caller must have it proved before sending it.
 */
export function keptAdminToken(url: string): KeptToken | undefined {
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
  const base = baseFor(listen, url);
  if (lines[0] === undefined || listen === undefined || base === undefined) {
    return undefined;
  }
  return { token: lines[0], listen, path, base };
}
