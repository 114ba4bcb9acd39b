// Acquire+commit pairs per second through @tollgate/client (dist/, `npm run build`), against a
// running server: `node bench/acquire-commit.mjs URL TOKEN LIMIT SECONDS CONCURRENCY`. Each of
// CONCURRENCY workers acquires one unit of LIMIT and commits it, one pair after another, for
// SECONDS; prints one JSON line {client, concurrency, pairs, seconds, pairs_per_s}. Run by
// scripts/bench-clients beside the Python client's twin (clients/python/bench).
import { Client } from "../dist/index.js";

const [url, token, limit, seconds, concurrency] = process.argv.slice(2);
const client = new Client({ url, token });
const end = performance.now() + Number(seconds) * 1000;
let pairs = 0;
async function worker() {
  while (performance.now() < end) {
    const permit = await client.acquire(limit);
    await permit.commit(1);
    pairs += 1;
  }
}
const started = performance.now();
await Promise.all(Array.from({ length: Number(concurrency) }, worker));
const elapsed = (performance.now() - started) / 1000;
console.log(JSON.stringify({
  client: "typescript",
  concurrency: Number(concurrency),
  pairs,
  seconds: elapsed,
  pairs_per_s: pairs / elapsed,
}));
