// Must NOT compile: a body whose field the document does not name, and one of a type it does
// not accept. test/openapi.test.ts compiles it to show that check.ts can fail.

import type { Reads, Sends } from "./check.js";
import type { components } from "./openapi.js";

type Schemas = components["schemas"];

export const renamed: Sends<{ limits: string[]; wait: number }, Schemas["AcquireBody"]> = true;
export const mistyped: Sends<{ limits: string[]; cost: string }, Schemas["AcquireBody"]> = true;
export const missing: Reads<{ permit: string; expires_at: number }, Schemas["Granted"]> = true;
