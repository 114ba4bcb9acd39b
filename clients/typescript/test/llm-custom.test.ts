// Another model API plugged into a token budget (`api: { estimate, reader }`): a made-up vendor
// served here (`POST /v2/generate` answering JSON, `POST /v2/stream` answering newline-delimited
// JSON), estimated and read by the test's own functions, against a real server, whose counts are
// read back through `/v1/stats`.

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { type Budget, Client, type CustomApi, type Estimate, llmFetch, type Reader, tollgateFetch, type Usage } from "../src/index.js";
import { ADMIN_TOKEN, Server, unique } from "./support.js";

/** The vendor's output when a request sets no limit: far past the estimator's guess. */
const UNCAPPED_WORDS = 300;
const OUTPUT_GUESS = 10;

let server: Server;
let client: Client;
let vendor: { host: string; close: () => Promise<void> };

/** The vendor's own count: input a token per word plus 3, output the request's limit, else 300. */
function vendorCounts(body: { prompt: string; limit?: number }): { in: number; out: number } {
  return { in: body.prompt.split(/\s+/).filter(Boolean).length + 3, out: body.limit ?? UNCAPPED_WORDS };
}

before(async () => {
  server = await Server.start();
  client = new Client({ url: server.url, token: ADMIN_TOKEN });
  const listening = createServer((request: IncomingMessage, response: ServerResponse) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      if (request.method !== "POST") {
        response.writeHead(200, { "content-type": "application/json" });
        response.end('{"models":["tiny"]}');
        return;
      }
      const used = vendorCounts(JSON.parse(Buffer.concat(chunks).toString()) as { prompt: string; limit?: number });
      if (request.url === "/v2/generate") {
        response.writeHead(200, { "content-type": "application/json" });
        response.end(JSON.stringify({ text: "tok ".repeat(used.out), used }));
        return;
      }
      // /v2/stream: a line a word, then the counts.
      response.writeHead(200, { "content-type": "application/x-ndjson" });
      for (let word = 0; word < used.out; word++) response.write('{"text":"tok "}\n');
      response.end(JSON.stringify({ used }) + "\n");
    });
  });
  await new Promise<void>((ready) => listening.listen({ host: "127.0.0.1", port: 0 }, ready));
  vendor = {
    host: `127.0.0.1:${(listening.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((closed) => {
        listening.closeAllConnections();
        listening.close(() => closed());
      }),
  };
});

after(async () => {
  await vendor.close();
  await server.stop();
});

/** The caller's reader: newline-delimited JSON objects (a JSON answer is one). */
class LinesReader implements Reader {
  readonly usage: Usage = { input: null, output: null, streamed: 0, finished: false, failed: false };
  #line = "";
  readonly #decoder = new TextDecoder();

  #read(line: string): void {
    if (line.trim() === "") return;
    const part = JSON.parse(line) as { text?: string; used?: { in: number; out: number } };
    this.usage.streamed += Buffer.byteLength(part.text ?? "");
    if (part.used !== undefined) {
      this.usage.input = part.used.in;
      this.usage.output = part.used.out;
      this.usage.finished = true;
    }
  }

  feed(chunk: Uint8Array): void {
    const lines = (this.#line + this.#decoder.decode(chunk, { stream: true })).split("\n");
    this.#line = lines.pop()!;
    for (const line of lines) this.#read(line);
  }

  end(): void {
    this.#read(this.#line);
    this.#line = "";
  }
}

/** The caller's estimator: generation calls only; input a token per prompt byte plus 3. */
const generate: CustomApi = {
  estimate(url, init): Estimate | null {
    if ((init.method ?? "GET") !== "POST" || !url.pathname.startsWith("/v2/")) return null;
    const body = JSON.parse(String(init.body)) as { prompt: string; limit?: number };
    return { input: Buffer.byteLength(body.prompt) + 3, output: body.limit ?? OUTPUT_GUESS, bounded: body.limit !== undefined };
  },
  reader: () => new LinesReader(),
};

async function budget(outputLimit = 100_000): Promise<Budget> {
  const names = { requests: unique("gen-r"), input: unique("gen-i"), output: unique("gen-o"), overrun: unique("gen-x") };
  await client.limits.put(names.requests, { kind: "rate", limit: 100, period_ms: 60_000 });
  await client.limits.put(names.input, { kind: "rate", limit: 100_000, period_ms: 60_000 });
  await client.limits.put(names.output, { kind: "rate", limit: outputLimit, period_ms: 60_000 });
  await client.limits.put(names.overrun, { kind: "concurrency", limit: 1, lease_ttl_ms: 60_000 });
  return { ...names, api: generate };
}

async function counted(budget: Budget): Promise<[number, number, number]> {
  const answer = await fetch(`${server.url}/v1/stats`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
  const stats = (await answer.json()) as { limits: Array<{ name: string; usage: { used: number } }> };
  const used = (name: string): number => stats.limits.find((limit) => limit.name === name)!.usage.used;
  return [used(budget.requests), used(budget.input), used(budget.output)];
}

function post(body: unknown): RequestInit {
  return { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) };
}

test("another API is settled with what its vendor reported", async () => {
  const plan = await budget();
  const call = llmFetch({ client, hosts: { [vendor.host]: plan } });
  const answer = (await (await call(`http://${vendor.host}/v2/generate`, post({ prompt: "say three short words", limit: 25 }))).json()) as { used: unknown };
  assert.deepEqual(answer.used, { in: 7, out: 25 });
  // Estimated 24 input and 25 output; the vendor's counts settle it.
  assert.deepEqual(await counted(plan), [1, 7, 25]);
});

test("another API's stream past its estimate is charged", async () => {
  // An output limit of 200: the 300 tokens streamed are past any top-up, so what ran past the
  // grant of 10 is charged at the end, a debt on the limit.
  const plan = await budget(200);
  const call = tollgateFetch({ client, hosts: {}, llm: { [vendor.host]: plan } });
  const answer = await call(`http://${vendor.host}/v2/stream`, post({ prompt: "write at length" }));
  const lines = (await answer.text()).split("\n").filter(Boolean);
  assert.equal(lines.length, UNCAPPED_WORDS + 1);
  assert.deepEqual(JSON.parse(lines.at(-1)!), { used: { in: 6, out: UNCAPPED_WORDS } });
  assert.deepEqual(await counted(plan), [1, 6, UNCAPPED_WORDS]);
});

test("a request the estimator declines passes unbudgeted", async () => {
  const plan = await budget();
  const call = llmFetch({ client, hosts: { [vendor.host]: plan } });
  assert.deepEqual(await (await call(`http://${vendor.host}/v2/models`)).json(), { models: ["tiny"] });
  assert.deepEqual(await counted(plan), [0, 0, 0]);
});

test("a bad estimate is refused naming the field", async () => {
  const plan = { ...(await budget()), api: { ...generate, estimate: () => ({ input: 5, output: 1.5, bounded: true }) } };
  const call = llmFetch({ client, hosts: { [vendor.host]: plan } });
  await assert.rejects(call(`http://${vendor.host}/v2/generate`, post({ prompt: "x" })), {
    name: "TypeError",
    message: "Estimate.output: must be a whole number of tokens",
  });
});
