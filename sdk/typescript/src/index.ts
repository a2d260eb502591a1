/**
 * TypeScript client of the Cordon sandbox service (`cordon serve`).
 *
 * ```ts
 * import { Cordon } from "cordon-sandbox";
 * const c = new Cordon();            // CORDON_URL and CORDON_API_KEY from the environment
 * console.log((await c.run("print(6*7)")).stdout);
 * ```
 */
export * from "./client.js";
export * from "./errors.js";
export type * from "./models.js";
