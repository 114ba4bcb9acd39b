// One process of the fleet tests: `concurrency` tasks sharing one Client, each making `calls`
// calls to the vendor. Prints {"statuses": [...], "errors": [...]} as its last line.
//
//   node fleet-worker.js acquire TOLLGATE_URL LIMITS VENDOR_URL CONCURRENCY CALLS
//     each call takes a permit on LIMITS (comma-separated, waiting up to a minute), then calls
//     the vendor while holding it;
//   node fleet-worker.js fetch TOLLGATE_URL LIMITS VENDOR_URL CONCURRENCY CALLS
//     each call goes through tollgateFetch, the vendor's host mapped to LIMITS;
//   node fleet-worker.js saturate TOLLGATE_URL LIMITS VENDOR_URL CONCURRENCY SECONDS LEARN START WARM
//     each task calls through tollgateFetch on its defaults (learning unless LEARN is
//     `nolearn`) from START (ms since the epoch) until SECONDS have passed. Before START, each
//     task makes one call through another tollgateFetch that maps the vendor to the limit WARM,
//     to the vendor's report (which the vendor does not count): the fleet starts together,
//     its connections open and its code warm, rather than as each process boots.

import { Client, tollgateFetch } from "../src/index.js";

const [mode, tollgateUrl, limits, vendorUrl, concurrency, calls, learn, start, warm] = process.argv.slice(2);
const names = limits!.split(",");
const client = new Client({ url: tollgateUrl!, timeout: 30 });
const host = new URL(vendorUrl!).host;
const call =
  mode === "fetch"
    ? tollgateFetch({ client, hosts: { [host]: names }, waitMax: 60, retriesMax: 5 })
    : mode === "saturate"
      ? tollgateFetch({ client, hosts: { [host]: names }, learn: learn !== "nolearn" })
      : async (url: string): Promise<Response> => {
          await using _permit = await client.acquire(names, { wait: 60 });
          return fetch(url);
        };
if (mode === "saturate") {
  const warmUp = tollgateFetch({ client, hosts: { [host]: warm! }, learn: learn !== "nolearn" });
  await Promise.all(
    Array.from({ length: Number(concurrency) }, async () => {
      await (await warmUp(new URL("/_vendor/report", vendorUrl))).arrayBuffer();
    }),
  );
  await new Promise((wake) => setTimeout(wake, Math.max(0, Number(start) - Date.now())));
}
const until = mode === "saturate" ? performance.now() + Number(calls) * 1000 : Infinity;
const more = (index: number): boolean => (mode === "saturate" ? performance.now() < until : index < Number(calls));

const statuses: number[] = [];
const errors: string[] = [];
await Promise.all(
  Array.from({ length: Number(concurrency) }, async () => {
    for (let index = 0; more(index); index += 1) {
      try {
        const response = await call(vendorUrl!);
        await response.arrayBuffer();
        statuses.push(response.status);
      } catch (error) {
        errors.push(String(error));
      }
    }
  }),
);
console.log(JSON.stringify({ statuses, errors }));
