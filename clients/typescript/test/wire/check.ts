// The client's wire types (src/wire.ts) held to the server's /openapi.json: test/openapi.test.ts
// writes the document's types to ./openapi.ts (openapi-typescript), then compiles this file,
// which does not compile unless every check below is `true`.

import type * as Wire from "../../src/wire.js";
import type { components } from "./openapi.js";

type Schemas = components["schemas"];

/** Fields the client names that the document does not. */
type Unnamed<Client, Server> = Exclude<keyof Client, keyof Server>;

/** The client sends only fields the document names, each a value the document accepts. */
export type Sends<Client, Server> = [Unnamed<Client, Server>] extends [never]
  ? [Client] extends [Server]
    ? true
    : { notAccepted: Client; by: Server }
  : { unnamedFields: Unnamed<Client, Server> };

/** The client reads only fields the document names, and reads every answer it describes. */
export type Reads<Client, Server> = [Unnamed<Client, Server>] extends [never]
  ? [Server] extends [Client]
    ? true
    : { notReadable: Server; as: Client }
  : { unnamedFields: Unnamed<Client, Server> };

/** The client's list and the document's name the same values. */
export type Same<Client, Server> = [Client] extends [Server]
  ? [Server] extends [Client]
    ? true
    : { missing: Exclude<Server, Client> }
  : { unknown: Exclude<Client, Server> };

// The reasons the client recognises at run time are the document's, no more and no fewer.
export const reasons: Same<(typeof Wire.DENY_REASONS)[number], Schemas["RateLimited"]["reason"]> = true;

// Bodies sent.
export const acquire: Sends<Wire.AcquireBody, Schemas["AcquireBody"]> = true;
export const commit: Sends<Wire.CommitBody, Schemas["CommitBody"]> = true;
export const charge: Sends<Wire.ChargeBody, Schemas["ChargeBody"]> = true;
export const pause: Sends<Wire.PauseBody, Schemas["PauseBody"]> = true;
export const learn: Sends<Wire.LearnBody, Schemas["LearnBody"]> = true;
export const learnQuota: Sends<Wire.LearnQuota, Schemas["QuotaBody"]> = true;
export const check: Sends<Wire.CheckBody, Schemas["CheckBody"]> = true;
export const rateRule: Sends<Wire.RateRule, Schemas["RateLimitBody"]> = true;
export const concurrencyRule: Sends<Wire.ConcurrencyRule, Schemas["ConcurrencyLimitBody"]> = true;
export const reserve: Sends<Wire.Reserve, Schemas["ReserveBody"]> = true;
export const match: Sends<Wire.Match, Schemas["MatchBody"]> = true;

// Answers read.
export const granted: Reads<Wire.Granted, Schemas["Granted"]> = true;
export const limitView: Reads<Wire.LimitView, Schemas["LimitView"]> = true;
export const rateLimited: Reads<Wire.RateLimitedBody, Schemas["RateLimited"]> = true;
export const committed: Reads<Wire.CommitAnswer, Schemas["CommitAnswer"]> = true;
export const charged: Reads<Wire.ChargeAnswer, Schemas["ChargeAnswer"]> = true;
export const chargedView: Reads<Wire.ChargedView, Schemas["ChargedView"]> = true;
export const renewed: Reads<Wire.RenewAnswer, Schemas["RenewAnswer"]> = true;
export const paused: Reads<Wire.PauseAnswer, Schemas["PauseAnswer"]> = true;
export const learnt: Reads<Wire.LearnAnswer, Schemas["LearnAnswer"]> = true;
export const learned: Reads<Wire.Learned, Schemas["LearnedLimitView"]> = true;
export const checked: Reads<Wire.CheckAnswer, Schemas["CheckAnswer"]> = true;
export const checkDenied: Reads<Wire.CheckDenied, Schemas["CheckDenied"]> = true;
export const limitList: Reads<Wire.LimitList, Schemas["LimitList"]> = true;
export const storedLimit: Reads<Wire.StoredLimit, Schemas["RawRule"]> = true;
export const rejectedRow: Reads<Wire.RejectedRow, Schemas["RejectedRow"]> = true;
export const badRequest: Reads<Wire.ErrorBody, Schemas["BadRequestError"]> = true;
export const badRequestDetail: Reads<Wire.ErrorDetail, Schemas["BadRequestError"]["error"]> = true;
export const unauthorized: Reads<Wire.ErrorBody, Schemas["UnauthorizedError"]> = true;
export const notFound: Reads<Wire.ErrorBody, Schemas["NotFoundError"]> = true;
export const conflict: Reads<Wire.ErrorBody, Schemas["ConflictError"]> = true;
export const unavailable: Reads<Wire.ErrorBody, Schemas["UnavailableError"]> = true;
