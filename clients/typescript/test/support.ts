/**
 * Test support: Tollgate servers started from the real binary ($TOLLGATE_BIN), the judging mock
 * vendor (`tollgate-mock-vendor`, beside it), and scripted vendors in this process.
 */

import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { accessSync, constants, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const ADMIN_TOKEN = "admin-token-for-tests";
/** Start-up and shutdown bounds: generous, the machine may be small and busy. */
const START_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;

/** The package's directory (the tests run from build/test/). */
export const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const REPOSITORY = resolve(PACKAGE, "..", "..");

/** A limit name no other test uses. */
export function unique(prefix = "t"): string {
  return `${prefix}-${randomUUID().replaceAll("-", "").slice(0, 12)}`;
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The `tollgate` binary: $TOLLGATE_BIN, else a cargo build of this repository. */
export function findBinary(): string {
  const given = process.env["TOLLGATE_BIN"];
  if (given) {
    if (!executable(given)) {
      throw new Error(`TOLLGATE_BIN=${given} is not an executable file`);
    }
    return given;
  }
  const targets = [process.env["CARGO_TARGET_DIR"], join(REPOSITORY, "target")].filter(
    (target): target is string => Boolean(target),
  );
  for (const target of targets) {
    for (const profile of ["debug", "release"]) {
      const candidate = join(target, profile, "tollgate");
      if (executable(candidate)) {
        return candidate;
      }
    }
  }
  throw new Error(
    "no tollgate binary: set TOLLGATE_BIN to the path of a built `tollgate` (cargo build -p tollgate-cli)",
  );
}

/**
 * The judging mock vendor, `tollgate-mock-vendor`: $TOLLGATE_MOCK_VENDOR_BIN, else beside the
 * `tollgate` binary.
 */
export function findMockVendor(): string {
  const given = process.env["TOLLGATE_MOCK_VENDOR_BIN"];
  const path = given || join(dirname(findBinary()), "tollgate-mock-vendor");
  if (!executable(path)) {
    throw new Error(
      `${given ? `TOLLGATE_MOCK_VENDOR_BIN=${given}` : path} is not an executable file: set TOLLGATE_MOCK_VENDOR_BIN to a built \`tollgate-mock-vendor\` (cargo build -p tollgate-fleet --bin tollgate-mock-vendor)`,
    );
  }
  return path;
}

/** What the judging mock vendor counted (`GET /_vendor/report`). */
export interface VendorReport {
  calls: number;
  ok: number;
  limited: number;
  most_in_any_window: number;
  most_in_fixed_window: number;
  windows_over: number;
  capacity: number;
  used_share: number;
  limit_changes: unknown[];
  arrivals_ms: number[];
}

/** How the judging mock vendor limits and which rate-limit headers it answers with. */
export interface MockVendorOptions {
  limit: number;
  periodMs: number;
  window: "sliding" | "fixed";
  headers: "none" | "ietf" | "openai" | "anthropic" | "github" | "ietf-draft";
  retryAfterS?: number;
}

/** A `tollgate-mock-vendor` process: a vendor that counts every arrival and judges the fleet. */
export class MockVendor {
  readonly url: string;
  readonly #process: ChildProcess;

  private constructor(url: string, child: ChildProcess) {
    this.url = url;
    this.#process = child;
  }

  static async start(options: MockVendorOptions): Promise<MockVendor> {
    const args = [
      "--listen",
      "127.0.0.1:0",
      "--limit",
      String(options.limit),
      "--period-ms",
      String(options.periodMs),
      "--window",
      options.window,
      "--headers",
      options.headers,
      ...(options.retryAfterS === undefined ? [] : ["--retry-after-s", String(options.retryAfterS)]),
    ];
    const child = spawn(findMockVendor(), args, { stdio: ["ignore", "pipe", "pipe"] });
    let log = "";
    child.stderr?.on("data", (chunk: Buffer) => {
      log += chunk.toString();
    });
    const url = await new Promise<string>((resolveUrl, reject) => {
      let stdout = "";
      const timer = setTimeout(() => reject(new Error(`tollgate-mock-vendor printed no address:\n${log}`)), START_TIMEOUT_MS);
      child.stdout?.on("data", (chunk: Buffer) => {
        stdout += chunk.toString();
        const found = /listening on (\S+)/.exec(stdout);
        if (found) {
          clearTimeout(timer);
          resolveUrl(found[1]!);
        }
      });
      child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`tollgate-mock-vendor exited early (${code}):\n${log}`));
      });
    });
    return new MockVendor(url.replace(/\/+$/, ""), child);
  }

  /** Its `host:port`, as tollgateFetch maps hosts. */
  get host(): string {
    return new URL(this.url).host;
  }

  async report(): Promise<VendorReport> {
    const response = await fetch(`${this.url}/_vendor/report`);
    if (response.status !== 200) {
      throw new Error(`the vendor's report: HTTP ${response.status}`);
    }
    return (await response.json()) as VendorReport;
  }

  /** Forget everything counted. */
  async reset(): Promise<void> {
    await (await fetch(`${this.url}/_vendor/reset`, { method: "POST" })).arrayBuffer();
  }

  async stop(): Promise<void> {
    const child = this.#process;
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((done) => child.once("exit", done));
      child.kill("SIGKILL");
      await exited;
    }
  }
}

/** A `tollgate serve` process on a free loopback port, in a directory of its own. */
export class Server {
  readonly url: string;
  readonly directory: string;
  readonly #process: ChildProcess;

  private constructor(url: string, directory: string, child: ChildProcess) {
    this.url = url;
    this.directory = directory;
    this.#process = child;
  }

  /**
   * Start one on `listen` with `args` besides the listener and rules, and `env` besides the
   * admin token (an `undefined` value takes a variable away).
   */
  static async start(
    args: string[] = [],
    env: Record<string, string | undefined> = {},
    listen = "127.0.0.1:0",
  ): Promise<Server> {
    const directory = mkdtempSync(join(tmpdir(), "tollgate-ts-"));
    // Nothing of the caller's Tollgate settings leaks in.
    const environment = Object.fromEntries(
      Object.entries(process.env).filter(([name]) => !name.startsWith("TOLLGATE_")),
    );
    const child = spawn(
      findBinary(),
      ["serve", "--listen", listen, "--rules", `sqlite://${join(directory, "rules.db")}`, ...args],
      {
        cwd: directory,
        env: Object.fromEntries(
          Object.entries({ ...environment, TOLLGATE_ADMIN_TOKEN: ADMIN_TOKEN, ...env }).filter(
            ([, value]) => value !== undefined,
          ),
        ),
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let log = "";
    child.stderr?.on("data", (chunk: Buffer) => {
      log += chunk.toString();
    });
    const url = await new Promise<string>((resolveUrl, reject) => {
      let stdout = "";
      const timer = setTimeout(() => reject(new Error(`tollgate serve printed no address:\n${log}`)), START_TIMEOUT_MS);
      child.stdout?.on("data", (chunk: Buffer) => {
        stdout += chunk.toString();
        const found = /listening on (\S+)/.exec(stdout);
        if (found) {
          clearTimeout(timer);
          resolveUrl(found[1]!);
        }
      });
      child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`tollgate serve exited early (${code}):\n${log}`));
      });
    });
    const server = new Server(url, directory, child);
    const deadline = Date.now() + START_TIMEOUT_MS;
    for (;;) {
      try {
        if ((await fetch(`${url}/readyz`)).status === 200) {
          return server;
        }
      } catch {
        // Not yet.
      }
      if (Date.now() > deadline) {
        await server.stop();
        throw new Error(`tollgate serve not ready:\n${log}`);
      }
      await new Promise((wake) => setTimeout(wake, 50));
    }
  }

  /** Kill it (SIGKILL): it stops without cleaning up. Its directory stays until `stop`. */
  async kill(): Promise<void> {
    const child = this.#process;
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((done) => child.once("exit", done));
      child.kill("SIGKILL");
      await exited;
    }
  }

  /** Stop it as an operator would (SIGTERM), killing it if it does not stop in time. */
  async stop(): Promise<void> {
    const child = this.#process;
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((done) => child.once("exit", done));
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.directory, { recursive: true, force: true });
  }
}

// ---- mock vendors -------------------------------------------------------------------------

/** How a mock vendor answers one call. */
export interface VendorAnswer {
  status: number;
  headers?: Record<string, string>;
}

/** Serve `answer` over HTTP on a free loopback port, for the length of the returned handle. */
export async function serveVendor(
  answer: (request: IncomingMessage, body: Buffer) => VendorAnswer,
): Promise<{ url: string; close: () => Promise<void> }> {
  const server: HttpServer = createServer((request: IncomingMessage, response: ServerResponse) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const { status, headers } = answer(request, Buffer.concat(chunks));
      response.writeHead(status, { "content-type": "application/json", ...headers });
      response.end("{}");
    });
  });
  // A fleet connects at once: the default backlog would drop connection attempts, and a
  // dropped SYN is retried a second later, a delay at the vendor no limiter could account for.
  await new Promise<void>((listening) => server.listen({ host: "127.0.0.1", port: 0, backlog: 1024 }, listening));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((closed) => {
        server.closeAllConnections();
        server.close(() => closed());
      }),
  };
}

/**
 * A vendor that, like Google Ads, answers 429 with a `Retry-After` and escalates the wait for
 * every call that arrives during the cessation it announced. It announces a cessation of
 * `retryAfter` seconds at the calls numbered in `announceAt` (counting from 1), unless one is
 * in force.
 */
export class EscalatingVendor {
  calls = 0;
  announced = 0;
  escalations = 0;
  #until = 0;
  #current = 0;

  constructor(
    readonly announceAt: ReadonlySet<number>,
    readonly retryAfter = 1,
  ) {}

  answer = (): VendorAnswer => {
    const now = performance.now();
    this.calls += 1;
    if (now < this.#until) {
      this.escalations += 1;
      this.#current *= 2;
      this.#until = now + this.#current * 1000;
      return { status: 429, headers: { "retry-after": String(this.#current) } };
    }
    if (this.announceAt.has(this.calls)) {
      this.announced += 1;
      this.#current = this.retryAfter;
      this.#until = now + this.#current * 1000;
      return { status: 429, headers: { "retry-after": String(this.#current) } };
    }
    return { status: 200 };
  };
}

/** A scripted vendor as a `fetch`: answers in turn (the last repeats), keeping every request. */
export class ScriptedVendor {
  readonly calls: Request[] = [];
  readonly bodies: string[] = [];
  readonly #answers: (Response | Error)[];

  constructor(...answers: (Response | Error)[]) {
    this.#answers = answers;
  }

  fetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init);
    this.calls.push(request);
    this.bodies.push(await request.text());
    const answer = this.#answers[Math.min(this.calls.length, this.#answers.length) - 1]!;
    if (answer instanceof Error) {
      throw answer;
    }
    return answer.clone();
  };
}

/** A JSON answer. */
export function json(status: number, body: unknown = {}, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
}

/** The shared vectors of Retry-After and the default classification. */
export function vectors(): {
  now: number;
  retry_after: { value?: string; hex?: string; seconds?: number | null; saturates?: boolean }[];
  verdicts: { status: number; retry_after?: string; verdict: string; seconds?: number | null }[];
} {
  return JSON.parse(readFileSync(join(REPOSITORY, "crates", "dispatch", "tests", "vectors", "retry_after.json"), "utf8"));
}

/** Write `text` to a new temporary file and return its path. */
export function temporaryFile(name: string, text: string): string {
  const directory = mkdtempSync(join(tmpdir(), "tollgate-ts-"));
  const path = join(directory, name);
  writeFileSync(path, text);
  return path;
}
