// Against the real binary: a kept admin token reaches no other program on its server's port,
// neither one on the port of a server that has stopped (even one that passes the challenge on
// to the real server elsewhere) nor one where `localhost` leads while the server listens on
// the other loopback address. The stand-in writes down every header it is sent.

import assert from "node:assert/strict";
import { lookup } from "node:dns/promises";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, Unauthorized } from "../src/index.js";
import { REPOSITORY, Server } from "./support.js";

const PROOF_PATH: string = JSON.parse(
  readFileSync(join(REPOSITORY, "crates", "cli", "tests", "vectors", "kept_token.json"), "utf8"),
).proof.path;

/**
 * Another user's program on a port this user's clients may reach: it writes down the headers
 * of every request, and answers 401, or passes a proof request on to `relay` (the real server
 * elsewhere, made to answer the challenge for it).
 */
async function standIn(
  host: string,
  port: number,
  relay?: string,
): Promise<{ port: number; heads: string[]; close: () => Promise<void> }> {
  const heads: string[] = [];
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    heads.push(`${request.method} ${request.url}\n${JSON.stringify(request.headers)}`);
    request.resume();
    request.on("end", () => {
      void (async () => {
        let status = 401;
        let body = '{"error":{"code":"unauthorized","message":"no"}}';
        if (relay !== undefined && request.url?.startsWith(PROOF_PATH)) {
          const passed = await fetch(`${relay}${request.url}`);
          status = passed.status;
          body = await passed.text();
        }
        response.writeHead(status, { "content-type": "application/json", connection: "close" });
        response.end(body);
      })();
    });
  });
  await new Promise<void>((listening) => server.listen({ host, port }, listening));
  return {
    port: (server.address() as AddressInfo).port,
    heads,
    close: () =>
      new Promise<void>((closed) => {
        server.closeAllConnections();
        server.close(() => closed());
      }),
  };
}

function assertNeverSent(heads: string[], token: string): void {
  for (const head of heads) {
    assert.ok(!head.includes(token), `the kept token reached the stand-in:\n${head}`);
    assert.ok(!head.toLowerCase().includes("authorization"), `credentials reached it:\n${head}`);
  }
}

const keptTokenOf = (server: Server): string =>
  readFileSync(join(server.directory, "rules.db.admin-token"), "utf8").split("\n")[0]!;
const portOf = (url: string): number => Number(url.slice(url.lastIndexOf(":") + 1));

let savedState: string | undefined;
let warnings: string[] = [];
const onWarning = (warning: Error): void => {
  warnings.push(warning.message);
};
before(() => {
  savedState = process.env["XDG_STATE_HOME"];
  process.on("warning", onWarning);
});
after(() => {
  process.off("warning", onWarning);
  if (savedState === undefined) {
    delete process.env["XDG_STATE_HOME"];
  } else {
    process.env["XDG_STATE_HOME"] = savedState;
  }
});

test("a token left by a stopped server is not sent to whoever listens on its port", async () => {
  const state = mkdtempSync(join(tmpdir(), "tollgate-ts-state-"));
  process.env["XDG_STATE_HOME"] = state;
  warnings = [];
  const first = await Server.start([], { TOLLGATE_ADMIN_TOKEN: undefined, XDG_STATE_HOME: state });
  const token = keptTokenOf(first);
  const port = portOf(first.url);
  // Stopped without cleaning up: its copy for the port stays.
  await first.kill();
  assert.ok(existsSync(join(state, "tollgate", "servers", `${port}.admin-token`)));
  // The same server (its token) back on another port, and another program on the old one.
  const restarted = await Server.start([], {
    TOLLGATE_ADMIN_TOKEN: undefined,
    XDG_STATE_HOME: state,
    TOLLGATE_STATE: `sqlite://${join(first.directory, "rules.db")}`,
  });
  const other = await standIn("127.0.0.1", port, restarted.url);
  try {
    await assert.rejects(new Client({ url: `http://127.0.0.1:${port}` }).limits.list(), Unauthorized);
    assertNeverSent(other.heads, token);
    assert.ok(other.heads.length > 0, "the client went to the stand-in");
    await new Promise((settled) => setImmediate(settled));
    assert.ok(
      warnings.some((warning) => warning.includes("did not prove that it holds it")),
      warnings.join("\n"),
    );
    await new Client({ url: restarted.url }).limits.list();
  } finally {
    await other.close();
    await restarted.stop();
    await first.stop();
  }
});

test("a kept token goes to the recorded address, not where localhost leads", async () => {
  const state = mkdtempSync(join(tmpdir(), "tollgate-ts-state-"));
  process.env["XDG_STATE_HOME"] = state;
  // Another program where `localhost` leads first; the server on the other loopback address.
  const first = (await lookup("localhost")).address;
  const otherLoopback = first.includes(":") ? "127.0.0.1" : "[::1]";
  const other = await standIn(first, 0);
  let server: Server | undefined;
  try {
    server = await Server.start(
      [],
      { TOLLGATE_ADMIN_TOKEN: undefined, XDG_STATE_HOME: state },
      `${otherLoopback}:${other.port}`,
    );
    const token = keptTokenOf(server);
    const tollgate = new Client({ url: `http://localhost:${other.port}` });
    try {
      await tollgate.limits.put("kept-token", { kind: "rate", limit: 1, period_ms: 1000 });
      assert.equal((await tollgate.limits.get("kept-token")).limit, 1);
    } finally {
      // First what the stand-in was sent, whether or not the calls went through.
      assertNeverSent(other.heads, token);
    }
  } finally {
    await other.close();
    await server?.stop();
  }
});
