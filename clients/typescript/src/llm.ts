/**
 * {@link llmFetch}: a `fetch` that keeps calls to language-model APIs inside a token budget on a
 * Tollgate server: requests, input tokens and output tokens per period, taken before a request
 * goes and settled as its answer comes.
 *
 * It recognises OpenAI-style (`/v1/chat/completions`, `/v1/responses`) and Anthropic-style
 * (`/v1/messages`) POSTs to a mapped host. Another API plugs in with the budget's `api`
 * ({@link CustomApi}): its `estimate` sees each request to the host that the built-in recognition
 * does not claim and gives an {@link Estimate}, or null to let the request pass unbudgeted; its
 * `reader` reads the answer as {@link UsageReader} does. Such a request takes the same grant,
 * top-ups, settlement and charge as the built-in APIs. Other requests pass untouched. For each it:
 *
 * 1. estimates the request from its JSON body: output is its `max_tokens`
 *    (`max_completion_tokens`, `max_output_tokens`), else the model's documented maximum
 *    (`outputDefault`, `models`); input is one token per byte of the body plus 8 per message and
 *    16 per request, which never counts fewer tokens than a byte-level tokeniser makes (or the
 *    caller's own count, `init.tollgate.inputTokens`);
 * 2. takes one request, the input estimate and the output estimate in one acquire (`costs` by
 *    limit), all or none, waiting up to `waitMax`; a request without an output cap takes the
 *    `overrun` lease in the same acquire when the budget names one;
 * 3. sends the request (a streaming chat request gets `stream_options.include_usage`) and passes
 *    the answer on chunk by chunk, reading it as it goes: when the text streamed passes what is
 *    held, the difference is asked for beside the stream, without waiting (a top-up; after a
 *    refusal, asked again no sooner than 0.1 s later), never charged while the answer streams;
 * 4. at the end commits what the vendor reported, the reservation limit by limit, then the
 *    top-ups, and refunds the rest. An answer that fails, is cut off or is cancelled is charged
 *    its reported usage, else its input estimate and the text streamed so far (a byte a token).
 *    What the answer used beyond its reservation and top-ups is charged (`POST /v1/charge`):
 *    counted on the server at once, past the limit if need be, a debt every later acquire in
 *    the fleet waits out. The charge comes before the commit that gives the overrun lease back.
 *
 * `tollgateFetch({ ..., llm: { host: budget } })` builds this into the client's own `fetch`, where
 * a host also mapped in `hosts` has its vendor's 429s pause the fleet as well.
 */

import type { Client, Permit } from "./client.js";

const KEPT_BYTES_MAX = 8 * 1024 * 1024;
const TOP_UP_STEP = 64;
const TOP_UP_RETRY = 0.1;

/** One vendor's limits on the server, and how its requests are estimated. */
export interface Budget {
  requests: string;
  input: string;
  output: string;
  /**
   * A concurrency limit of 1 that requests without an output cap hold until settled and what
   * they ran past their grant is charged: one such stream at a time, fleet-wide, can outrun
   * its estimate.
   */
  overrun?: string;
  /** Output estimate of a request without a cap: the model's documented maximum (32768). */
  outputDefault?: number;
  /** Documented maximum output by model name prefix (the longest prefix wins). */
  models?: Record<string, number>;
  /** Input tokens allowed per message for the chat template (8). */
  perMessage?: number;
  /** Input tokens allowed per request (16). */
  perRequest?: number;
  /** Longest wait for a grant, in seconds (60). */
  waitMax?: number;
  /** Another API's estimator and answer reader, for the requests the built-in recognition does not claim. */
  api?: CustomApi;
}

/**
 * Reads one answer as it passes, chunk by chunk: `usage` is read after every chunk (for top-ups)
 * and once more after `end()` (for the settlement). {@link UsageReader} is one.
 */
export interface Reader {
  feed(chunk: Uint8Array): void;
  end(): void;
  readonly usage: Usage;
}

/**
 * Another model API: `estimate` gives a request's {@link Estimate} (null: the request is not a
 * model call and passes unbudgeted; a throw reaches the caller), and `reader` makes a fresh
 * {@link Reader} for each answer.
 */
export interface CustomApi {
  estimate(url: URL, init: LlmRequestInit): Estimate | null;
  reader(): Reader;
}

export type Api = "chat" | "responses" | "messages";

/** The API a path speaks, if one of the three. */
export function recognise(path: string): Api | null {
  const bare = path.split("?")[0]!.replace(/\/+$/, "");
  if (bare.endsWith("/chat/completions")) return "chat";
  if (bare.endsWith("/responses")) return "responses";
  if (bare.endsWith("/messages")) return "messages";
  return null;
}

/**
 * A whole number of tokens from 0 to 2^53 - 1, else null: the one reading of a count that the
 * Rust and Python implementations share (JSON's `50.0` is 50 here as there).
 */
function count(value: unknown): number | null {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0 ? value : null;
}

/** Whether a JSON field is present: null is as if absent. */
function present(value: unknown): boolean {
  return value !== undefined && value !== null;
}

/**
 * What a request is expected to use: `input` and `output` tokens, whether the vendor never writes
 * past `output` (`bounded`: a cap the request sets), and whether the answer streams (read by the
 * built-in APIs only).
 */
export interface Estimate {
  input: number;
  output: number;
  bounded: boolean;
  stream?: boolean;
}

/** A custom estimator's answer, refused with the field and the reason when it is not one. */
function checked(found: Estimate): Estimate {
  if (typeof found !== "object" || found === null) throw new TypeError("estimate: must return an Estimate or null");
  for (const name of ["input", "output"] as const) {
    if (count(found[name]) === null) throw new TypeError(`Estimate.${name}: must be a whole number of tokens`);
  }
  return { input: Math.max(1, found.input), output: Math.max(1, found.output), bounded: found.bounded === true, stream: found.stream === true };
}

/** A request's estimate; errors name the field. */
export function estimate(api: Api, body: string, budget: Budget, inputTokens?: number): Estimate {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch (error) {
    throw new TypeError(`body: not JSON: ${String(error)}`);
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new TypeError("body: must be a JSON object");
  }
  const fields = { chat: ["max_completion_tokens", "max_tokens"], responses: ["max_output_tokens"], messages: ["max_tokens"] }[api];
  const request = json as Record<string, unknown>;
  let output: number | null = null;
  for (const field of fields) {
    const value = request[field];
    if (!present(value)) continue;
    output = count(value);
    if (output === null) throw new TypeError(`${field}: must be a whole number of tokens`);
    break;
  }
  const bounded = output !== null;
  if (output === null) {
    const model = typeof request["model"] === "string" ? request["model"] : "";
    const prefixes = Object.keys(budget.models ?? {}).filter((prefix) => model.startsWith(prefix));
    const longest = prefixes.sort((a, b) => b.length - a.length)[0];
    output = longest === undefined ? (budget.outputDefault ?? 32_768) : budget.models![longest]!;
  }
  let messages = ["messages", "input"]
    .map((field) => request[field])
    .filter(present)
    .reduce<number>((sum, value) => sum + (Array.isArray(value) ? value.length : 1), 0);
  if (present(request["system"]) || present(request["instructions"])) messages += 1;
  const guess = Buffer.byteLength(body) + (budget.perMessage ?? 8) * messages + (budget.perRequest ?? 16);
  return { input: Math.max(1, inputTokens ?? guess), output: Math.max(1, output), bounded, stream: request["stream"] === true };
}

export interface Usage {
  input: number | null;
  output: number | null;
  /** Bytes of generated text streamed so far: never fewer than the tokens they hold. */
  streamed: number;
  finished: boolean;
  failed: boolean;
}

type Json = Record<string, unknown>;

function usageOf(value: unknown): [number | null, number | null] {
  if (typeof value !== "object" || value === null) return [null, null];
  const usage = value as Json;
  const int = (key: string): number | null => count(usage[key]);
  let input = int("prompt_tokens");
  if (input === null && int("input_tokens") !== null) {
    input = int("input_tokens")! + (int("cache_creation_input_tokens") ?? 0) + (int("cache_read_input_tokens") ?? 0);
  }
  return [input, int("completion_tokens") ?? int("output_tokens")];
}

function textBytes(value: unknown): number {
  return typeof value === "string" ? Buffer.byteLength(value) : 0;
}

function field(value: unknown, key: string): unknown {
  return typeof value === "object" && value !== null ? (value as Json)[key] : undefined;
}

/** Reads one answer chunk by chunk, JSON or server-sent events, holding nothing back. */
export class UsageReader {
  readonly usage: Usage = { input: null, output: null, streamed: 0, finished: false, failed: false };
  readonly #events: boolean;
  readonly #decoder = new TextDecoder();
  #line = "";
  #data: string[] = [];
  #kept = "";
  #over = false;

  constructor(events: boolean) {
    this.#events = events;
  }

  #note([input, output]: [number | null, number | null]): void {
    if (input !== null) this.usage.input = input;
    if (output !== null) this.usage.output = output;
  }

  feed(chunk: Uint8Array): void {
    const text = this.#decoder.decode(chunk, { stream: true });
    if (!this.#events) {
      if (this.#kept.length + text.length > KEPT_BYTES_MAX) {
        this.#over = true;
        this.#kept = "";
      }
      if (!this.#over) this.#kept += text;
      return;
    }
    this.#line += text;
    let end: number;
    while ((end = this.#line.indexOf("\n")) >= 0) {
      const line = this.#line.slice(0, end).replace(/\r$/, "");
      this.#line = this.#line.slice(end + 1);
      if (line === "") {
        const data = this.#data.join("\n");
        this.#data = [];
        this.#event(data);
      } else if (line.startsWith("data:")) {
        const value = line.slice(5);
        this.#data.push(value.startsWith(" ") ? value.slice(1) : value);
      }
    }
  }

  end(): void {
    if (this.#events) {
      this.#event(this.#data.join("\n"));
      this.#data = [];
      return;
    }
    if (this.#over) return;
    let answer: unknown;
    try {
      answer = JSON.parse(this.#kept);
    } catch {
      return; // Not JSON: its usage is unknown, and the policy applies.
    }
    if (typeof answer !== "object" || answer === null || Array.isArray(answer)) return;
    this.#note(usageOf(field(answer, "usage")));
    this.usage.failed = present(field(answer, "error"));
    this.usage.finished = !this.usage.failed;
  }

  #event(data: string): void {
    if (data === "") return;
    if (data === "[DONE]") {
      this.usage.finished = true;
      return;
    }
    let event: unknown;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    const type = field(event, "type");
    const kind = typeof type === "string" ? type : "";
    if (kind === "message_start") {
      this.#note(usageOf(field(field(event, "message"), "usage")));
    } else if (kind === "message_delta") {
      this.#note(usageOf(field(event, "usage")));
    } else if (kind === "content_block_delta") {
      const delta = field(event, "delta");
      this.usage.streamed += textBytes(field(delta, "text")) + textBytes(field(delta, "partial_json")) + textBytes(field(delta, "thinking"));
    } else if (kind === "message_stop") {
      this.usage.finished = true;
    } else if (kind === "error" || kind === "response.failed" || kind === "response.error") {
      this.usage.failed = true;
      this.#note(usageOf(field(field(event, "response"), "usage")));
    } else if (kind.startsWith("response.") && kind.endsWith(".delta")) {
      this.usage.streamed += textBytes(field(event, "delta"));
    } else if (kind === "response.completed" || kind === "response.incomplete") {
      this.#note(usageOf(field(field(event, "response"), "usage")));
      this.usage.finished = true;
    } else {
      if (present(field(event, "error"))) this.usage.failed = true;
      const choices = field(event, "choices");
      for (const choice of Array.isArray(choices) ? choices : []) {
        const delta = field(choice, "delta");
        this.usage.streamed += textBytes(field(delta, "content")) + textBytes(field(delta, "refusal"));
        const calls = field(delta, "tool_calls");
        for (const call of Array.isArray(calls) ? calls : []) {
          this.usage.streamed += textBytes(field(field(call, "function"), "arguments"));
        }
      }
      this.#note(usageOf(field(event, "usage")));
    }
  }
}

/** How {@link llmFetch} is configured. */
export interface LlmFetchOptions {
  client: Client;
  /** Host (`api.openai.com`, or `host:port`) to its budget. */
  hosts: Record<string, Budget>;
  /** The `fetch` that sends (default the global one; a `tollgateFetch` adds fleet pauses). */
  fetch?: typeof fetch;
}

/** `fetch`'s options, and the caller's own count of the input tokens. */
export interface LlmRequestInit extends RequestInit {
  tollgate?: { inputTokens?: number };
}

function charged(found: Estimate, usage: Usage): [number, number] {
  // Read as counts: a plugged-in reader's figure that is not one is not read.
  const all = count(usage.streamed) ?? 0;
  const streamed = found.bounded ? Math.min(all, found.output) : all;
  const [input, reported] = [count(usage.input), count(usage.output)];
  // Until the answer is finished, a reported output (Anthropic's message_start says 1) is only
  // a floor: the text streamed counts when it is more.
  const output = reported === null ? streamed : usage.finished ? reported : Math.max(reported, streamed);
  return [input ?? found.input, output];
}

/**
 * Input and output tokens by limit name: added together when one limit counts both (a vendor
 * with one TPM names it as both `input` and `output`).
 */
function byLimit(budget: Budget, input: number, output: number): Record<string, number> {
  const each: Record<string, number> = { [budget.input]: input };
  each[budget.output] = (each[budget.output] ?? 0) + output;
  return each;
}

/** One request's grant, its top-ups and its settlement. */
class Held {
  readonly extra: Array<[0 | 1, Permit]> = [];
  readonly topped: [number, number] = [0, 0];
  #retryAt = 0;
  #topping: Promise<void> = Promise.resolve();
  sentAt: number | null = null;

  constructor(
    readonly client: Client,
    readonly budget: Budget,
    readonly found: Estimate,
    /** The reservation: one request, the estimates, and the overrun lease if taken. */
    readonly permit: Permit,
  ) {}

  /** Top-ups due for what the answer showed, asked one after another beside the stream. */
  show(usage: Usage): void {
    this.#topping = this.#topping.then(async () => {
      if (performance.now() / 1000 < this.#retryAt) return;
      const shown = charged(this.found, usage);
      const held = [this.found.input, this.found.output];
      for (const kind of [0, 1] as const) {
        const need = shown[kind] - held[kind]! - this.topped[kind];
        if (need <= 0) continue;
        const tokens = Math.ceil(need / TOP_UP_STEP) * TOP_UP_STEP;
        try {
          const permit = await this.client.acquire([[this.budget.input, this.budget.output][kind]!], { cost: tokens });
          this.extra.push([kind, permit]);
          this.topped[kind] += tokens;
        } catch {
          // Refused, or more than the limit can ever grant. Not charged while streaming: the
          // text streamed is only an upper bound on the tokens, and a charge is never given
          // back. The settlement charges what the vendor reports past the grant.
          this.#retryAt = performance.now() / 1000 + TOP_UP_RETRY;
        }
      }
    });
  }

  async settle(used: [number, number]): Promise<void> {
    await this.#topping.catch(() => undefined);
    // The reservation first, then each top-up, as far as the tokens used go; what is left past
    // them is charged.
    const left: [number, number] = [...used];
    const own = [Math.min(left[0], this.found.input), Math.min(left[1], this.found.output)] as const;
    left[0] -= own[0];
    left[1] -= own[1];
    const parts: Array<[Permit, number]> = this.extra.map(([kind, permit]) => {
      const part = Math.min(left[kind], permit.cost);
      left[kind] -= part;
      return [permit, part];
    });
    const past = Object.fromEntries(Object.entries(byLimit(this.budget, ...left)).filter(([, units]) => units > 0));
    // Charged before the commit that gives the overrun lease back: no other uncapped stream
    // starts before the fleet counts this one's excess.
    if (Object.keys(past).length > 0) await this.client.charge(Object.keys(past), { costs: past });
    for (const [permit, part] of parts) await permit.commit(part);
    await this.permit.commit(
      { [this.budget.requests]: 1, ...byLimit(this.budget, own[0], own[1]) },
      this.sentAt === null ? {} : { sentAfter: Math.max(0, this.sentAt - this.permit.grantedAt) },
    );
  }
}

/**
 * What one request asks of the server in its one acquire: the limits (the request, its input
 * and output tokens, and the overrun lease when it sets no output cap) and the tokens by limit
 * name (one request is the cost of the rest).
 */
function asks(budget: Budget, found: Estimate): [string[], Record<string, number>] {
  const limits = [...new Set([budget.requests, budget.input, budget.output])];
  if (!found.bounded && budget.overrun !== undefined) limits.push(budget.overrun);
  return [limits, byLimit(budget, found.input, found.output)];
}

async function reserve(client: Client, budget: Budget, found: Estimate): Promise<Held> {
  const [limits, costs] = asks(budget, found);
  const permit = await client.acquire(limits, { costs, wait: budget.waitMax ?? 60 });
  return new Held(client, budget, found, permit);
}

/** Make a `fetch` that keeps model calls inside their budgets (see the module documentation). */
export function llmFetch(options: LlmFetchOptions): (input: string | URL | Request, init?: LlmRequestInit) => Promise<Response> {
  const inner = options.fetch ?? globalThis.fetch;
  return async (input, init = {}) => {
    if (input instanceof Request) return inner(input, init); // its body cannot be read first
    const url = new URL(String(input));
    const budget = options.hosts[url.host] ?? options.hosts[url.hostname];
    if (budget === undefined) return inner(input, init);
    const api = recognise(url.pathname);
    if (api === null || (init.method ?? "GET").toUpperCase() !== "POST" || typeof init.body !== "string") {
      const custom = budget.api;
      const found = custom?.estimate(url, init) ?? null;
      if (custom === undefined || found === null) return inner(input, init);
      return metered(options.client, inner, input, init, budget, checked(found), () => custom.reader());
    }
    const { tollgate } = init;
    let body = init.body;
    const found = estimate(api, body, budget, tollgate?.inputTokens);
    if (api === "chat" && found.stream) {
      const parsed = JSON.parse(body) as Json;
      const streamOptions = parsed["stream_options"];
      if (field(streamOptions, "include_usage") === undefined) {
        parsed["stream_options"] = { ...(typeof streamOptions === "object" && streamOptions !== null ? streamOptions : {}), include_usage: true };
        body = JSON.stringify(parsed);
      }
    }
    return metered(options.client, inner, input, { ...init, body }, budget, found, (response) =>
      new UsageReader((response.headers.get("content-type") ?? "").startsWith("text/event-stream")),
    );
  };
}

/**
 * One budgeted request, built-in or plugged in alike: the grant, the send, the answer read as it
 * passes with top-ups beside it, and the settlement and charge at its end.
 */
async function metered(
  client: Client,
  inner: typeof fetch,
  input: string | URL,
  init: LlmRequestInit,
  budget: Budget,
  found: Estimate,
  makeReader: (response: Response) => Reader,
): Promise<Response> {
  const held = await reserve(client, budget, found);
  held.sentAt = performance.now() / 1000;
  let response: Response;
  try {
    // `tollgate` passes on: a tollgateFetch underneath reads its priority.
    response = await inner(input, init);
  } catch (error) {
    // The vendor may have seen it: keep the estimate, unless the connection never opened.
    const refused = (error as { cause?: { code?: string } })?.cause?.code === "ECONNREFUSED";
    await held.settle(refused ? [0, 0] : [found.input, found.output]);
    throw error;
  }
  if (response.status >= 400 || response.body === null) {
    const content = await response.arrayBuffer();
    const reader = response.status >= 400 ? new UsageReader(false) : makeReader(response);
    reader.feed(new Uint8Array(content));
    reader.end();
    await held.settle(response.status >= 400 ? [0, 0] : charged(found, reader.usage));
    return new Response(content, { status: response.status, statusText: response.statusText, headers: response.headers });
  }
  const reader = makeReader(response);
  const source = response.body.getReader();
  let settled = false;
  const settle = async (): Promise<void> => {
    if (settled) return;
    settled = true;
    reader.end();
    await held.settle(charged(found, reader.usage));
  };
  const stream = new ReadableStream<Uint8Array>({
    async pull(controller) {
      let next: Awaited<ReturnType<typeof source.read>>;
      try {
        next = await source.read();
      } catch (error) {
        await settle();
        controller.error(error);
        return;
      }
      if (next.done) {
        await settle();
        controller.close();
        return;
      }
      reader.feed(next.value);
      held.show(reader.usage);
      controller.enqueue(next.value);
    },
    async cancel(reason) {
      await source.cancel(reason).catch(() => undefined);
      await settle();
    },
  });
  return new Response(stream, { status: response.status, statusText: response.statusText, headers: response.headers });
}
