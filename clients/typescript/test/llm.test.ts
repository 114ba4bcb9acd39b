// llmFetch judged by the mock model server (`tollgate-mock-model`, a real binary), which counts
// requests, input and output tokens on its own clock and answers 429 past its limits, against a
// real server. Safety (no 429, no window over) is asserted exactly.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";

import { type Budget, Client, estimate, llmFetch, recognise, tollgateFetch, UsageReader } from "../src/index.js";
import { ADMIN_TOKEN, findBinary, Server, unique } from "./support.js";

const PERIOD_MS = 3000;
const RPM = 100;
const ITPM = 40_000;
const OTPM = 3000;

let server: Server;
let client: Client;

before(async () => {
  server = await Server.start();
  client = new Client({ url: server.url, token: ADMIN_TOKEN });
});

after(async () => {
  await server.stop();
});

interface ModelReport {
  ok: number;
  limited: number;
  most_output_in_any_window: number;
  most_input_in_any_window: number;
}

async function withModel(work: (url: string) => Promise<void>): Promise<void> {
  const binary = process.env["TOLLGATE_MOCK_MODEL_BIN"] || join(dirname(findBinary()), "tollgate-mock-model");
  const args = ["--listen", "127.0.0.1:0", "--rpm", String(RPM), "--itpm", String(ITPM), "--otpm", String(OTPM), "--period-ms", String(PERIOD_MS)];
  const child: ChildProcess = spawn(binary, args, { stdio: ["ignore", "pipe", "inherit"] });
  try {
    const url = await new Promise<string>((resolve, reject) => {
      let stdout = "";
      child.stdout?.on("data", (chunk: Buffer) => {
        stdout += chunk.toString();
        const found = /listening on (\S+)/.exec(stdout);
        if (found) resolve(found[1]!);
      });
      child.on("exit", (code) => reject(new Error(`tollgate-mock-model exited (${code})`)));
    });
    await work(url);
  } finally {
    child.kill("SIGKILL");
  }
}

async function budget(): Promise<Budget> {
  const names = { requests: unique("llm-r"), input: unique("llm-i"), output: unique("llm-o"), overrun: unique("llm-x") };
  await client.limits.put(names.requests, { kind: "rate", limit: RPM, period_ms: PERIOD_MS });
  await client.limits.put(names.input, { kind: "rate", limit: ITPM, period_ms: PERIOD_MS });
  await client.limits.put(names.output, { kind: "rate", limit: OTPM, period_ms: PERIOD_MS });
  await client.limits.put(names.overrun, { kind: "concurrency", limit: 1, lease_ttl_ms: 60_000 });
  return { ...names, outputDefault: 200 };
}

async function used(name: string): Promise<number> {
  const answer = await fetch(`${server.url}/v1/stats?limit=${name}`, { headers: { Authorization: `Bearer ${ADMIN_TOKEN}` } });
  const stats = (await answer.json()) as { limits: Array<{ name: string; usage: { used: number } }> };
  return stats.limits.find((limit) => limit.name === name)!.usage.used;
}

async function drain(response: Response, chunks = Infinity): Promise<void> {
  const reader = response.body!.getReader();
  for (let count = 0; ; count++) {
    if (count >= chunks) {
      await reader.cancel();
      return;
    }
    const next = await reader.read();
    if (next.done) return;
  }
}

test("paths, estimates and usage are read", () => {
  assert.equal(recognise("/v1/chat/completions"), "chat");
  assert.equal(recognise("/v1/embeddings"), null);
  const body = '{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}';
  const found = estimate("messages", body, { requests: "r", input: "i", output: "o" });
  assert.deepEqual(found, { input: body.length + 8 + 16, output: 50, bounded: true, stream: false });
  assert.throws(() => estimate("chat", '{"max_tokens":"x"}', { requests: "r", input: "i", output: "o" }), /^TypeError: max_tokens:/);
  const reader = new UsageReader(true);
  const encode = (text: string): Uint8Array => new TextEncoder().encode(text);
  reader.feed(encode('data: {"choices":[{"delta":{"content":"hel'));
  reader.feed(encode('lo"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'));
  reader.end();
  assert.deepEqual([reader.usage.input, reader.usage.output, reader.usage.streamed], [5, 2, 5]);
});

test("concurrent callers sharing a budget never pass the model's limits", async () => {
  const shared = await budget();
  await withModel(async (model) => {
    const host = new URL(model).host;
    const call = llmFetch({ client: new Client({ url: server.url }), hosts: { [host]: shared } });
    const until = Date.now() + 8000;
    let seed = 1;
    const random = (): number => {
      seed = (seed * 16807) % 2147483647;
      return seed / 2147483647;
    };
    const caller = async (): Promise<void> => {
      while (Date.now() < until) {
        const [path, cap, key] = [
          ["/v1/chat/completions", "max_tokens", "messages"],
          ["/v1/responses", "max_output_tokens", "input"],
          ["/v1/messages", "max_tokens", "messages"],
        ][Math.floor(random() * 3)]!;
        const stream = random() < 0.7;
        const tokens = 10 + Math.floor(random() * 190);
        const headers: Record<string, string> = { "x-mock-tokens": String(tokens) };
        const chance = random();
        if (chance < 0.05) headers["x-mock-fail-after"] = String(Math.floor(random() * tokens));
        else if (chance < 0.1) headers["x-mock-cut-after"] = String(Math.floor(random() * tokens));
        const body = JSON.stringify({ model: "mock-1", [cap!]: 200, stream, [key!]: [{ role: "user", content: "word ".repeat(4 + Math.floor(random() * 56)) }] });
        try {
          const answer = await call(`${model}${path}`, { method: "POST", body, headers });
          await drain(answer, stream && chance > 0.95 ? 2 : Infinity);
        } catch {
          // Cut off on demand.
        }
      }
    };
    await Promise.all(Array.from({ length: 6 }, caller));
    const report = (await (await fetch(`${model}/_model/report`)).json()) as ModelReport;
    assert.equal(report.limited, 0, JSON.stringify(report));
    assert.ok(report.most_output_in_any_window <= OTPM, JSON.stringify(report));
    assert.ok(report.most_input_in_any_window <= ITPM, JSON.stringify(report));
    assert.ok(report.ok > 20, JSON.stringify(report));
  });
});

test("a cancelled stream is charged its input and what it streamed; a finished one what it reported", async () => {
  await withModel(async (model) => {
    const host = new URL(model).host;
    const shared = await budget();
    const call = llmFetch({ client, hosts: { [host]: shared } });
    const body = JSON.stringify({ model: "m", max_tokens: 100, stream: true, messages: [{ role: "user", content: "hello" }] });
    await drain(await call(`${model}/v1/chat/completions`, { method: "POST", body, headers: { "x-mock-tokens": "100" } }), 1);
    const charged = await used(shared.output);
    assert.ok(charged >= 1 && charged < 100, String(charged));
    assert.equal(await used(shared.requests), 1);

    const other = await budget();
    const reported = llmFetch({ client, hosts: { [host]: other } });
    await drain(await reported(`${model}/v1/messages`, { method: "POST", body, headers: { "x-mock-tokens": "37" } }));
    assert.equal(await used(other.output), 37);
    assert.equal(await used(other.input), 5);

    const unbounded = await budget();
    const topped = llmFetch({ client, hosts: { [host]: unbounded } });
    const open = JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] });
    await drain(await topped(`${model}/v1/messages`, { method: "POST", body: open, headers: { "x-mock-tokens": "500" } }));
    assert.equal(await used(unbounded.output), 500);
  });
});

test("an uncapped stream past a full limit is charged before its lease goes", async () => {
  await withModel(async (model) => {
    const host = new URL(model).host;
    const tight = await budget();
    // Room for the estimate (200) and one top-up (64) at most: most of the 500 tokens the model
    // writes can only be charged.
    await client.limits.put(tight.output, { kind: "rate", limit: 300, period_ms: 60_000 });
    const calls: Array<[string, Record<string, unknown>]> = [];
    const recording = new Client({
      url: server.url,
      fetch: async (input, init) => {
        calls.push([new URL(String(input)).pathname, JSON.parse(String(init?.body ?? "{}")) as Record<string, unknown>]);
        return fetch(input, init);
      },
    });
    const call = llmFetch({ client: recording, hosts: { [host]: tight } });
    const open = JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] });
    await drain(await call(`${model}/v1/messages`, { method: "POST", body: open, headers: { "x-mock-tokens": "500" } }));
    // One acquire of the request, both estimates and the overrun lease.
    const [path, asked] = calls[0]!;
    assert.equal(path, "/v1/acquire");
    assert.deepEqual(asked["limits"], [tight.requests, tight.input, tight.output, tight.overrun]);
    assert.equal((asked["costs"] as Record<string, number>)[tight.output], 200);
    // Every token the model wrote is counted, past the limit: later grants wait it out.
    assert.equal(await used(tight.output), 500);
    assert.equal(await client.tryAcquire(tight.output, { priority: "high" }), null);
    // The charge came before the commit that gave the overrun lease back.
    const charge = calls.findIndex(([each]) => each === "/v1/charge");
    const settled = calls.findIndex(([each, sent]) => each.endsWith("/commit") && typeof sent["used"] === "object");
    assert.ok(charge >= 0 && charge < settled, JSON.stringify(calls.map(([each]) => each)));
    const reservation = calls[settled]![1]["used"] as Record<string, number>;
    assert.deepEqual([reservation[tight.requests], reservation[tight.output]], [1, 200]);
    assert.deepEqual(Object.keys(calls[charge]![1]["costs"] as object), [tight.output]);
    assert.notEqual(await client.tryAcquire(tight.overrun!), null);
  });
});

test("one limit for input and output is named once and counts both", async () => {
  await withModel(async (model) => {
    const host = new URL(model).host;
    const shared = await budget();
    const oneTpm = { ...shared, output: shared.input }; // as a vendor that counts both together has
    const call = llmFetch({ client, hosts: { [host]: oneTpm } });
    const body = JSON.stringify({ model: "m", max_tokens: 100, messages: [{ role: "user", content: "hello" }] });
    const answer = await call(`${model}/v1/messages`, { method: "POST", body, headers: { "x-mock-tokens": "37" } });
    assert.equal(answer.status, 200);
    await answer.arrayBuffer();
    assert.equal(await used(shared.input), 5 + 37);
    assert.equal(await used(shared.requests), 1);
  });
});

test("tollgateFetch keeps a budget given as llm, and the host's own quota beside it", async () => {
  await withModel(async (model) => {
    const host = new URL(model).host;
    const shared = await budget();
    const call = tollgateFetch({ client, hosts: {}, llm: { [host]: shared } });
    const body = JSON.stringify({ model: "m", max_tokens: 100, stream: true, messages: [{ role: "user", content: "hello" }] });
    await drain(await call(`${model}/v1/chat/completions`, { method: "POST", body, headers: { "x-mock-tokens": "37" } }));
    // Not a model call: passes untouched, taking nothing.
    const report = (await (await call(`${model}/_model/report`)).json()) as ModelReport;
    assert.equal(report.ok, 1);
    assert.equal(await used(shared.output), 37);
    assert.equal(await used(shared.input), 5);
    assert.equal(await used(shared.requests), 1);

    const other = await budget();
    const calls = unique("llm-calls");
    await client.limits.put(calls, { kind: "rate", limit: 100, period_ms: PERIOD_MS });
    const both = tollgateFetch({ client, hosts: { [host]: calls }, llm: { [host]: other } });
    const whole = JSON.stringify({ model: "m", max_output_tokens: 100, input: "hello" });
    const answer = await both(`${model}/v1/responses`, { method: "POST", body: whole, headers: { "x-mock-tokens": "12" } });
    assert.equal(answer.status, 200);
    await answer.arrayBuffer();
    assert.equal(await used(other.output), 12);
    assert.equal(await used(other.requests), 1);
    assert.equal(await used(calls), 1);
  });
});

test("tollgateFetch needs hosts or llm", () => {
  assert.throws(() => tollgateFetch({ client, hosts: {} }), /^RangeError: hosts: /);
});
