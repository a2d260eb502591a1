// Starts a real `cordon serve` for the tests (binary: $CORDON_BIN, else the workspace's
// build under $CARGO_TARGET_DIR or target/), as sdk/python/tests/conftest.py does.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
export const KEYS = {
  alice: "ck_test_alice_key_0123456789abcdef0123456789",
  bob: "ck_test_bob_key_0123456789abcdef0123456789ab",
  // The operator's own tenant (edge.dashboard_operators): /metrics and the pools.
  ops: "ck_test_ops_key_0123456789abcdef0123456789ab",
};

export function cordonBin() {
  if (process.env.CORDON_BIN) return process.env.CORDON_BIN;
  const target = process.env.CARGO_TARGET_DIR || join(ROOT, "target");
  for (const p of [join(target, "debug/cordon"), join(target, "release/cordon")]) {
    if (existsSync(p)) return p;
  }
  throw new Error("no cordon binary: run `cargo build` or set CORDON_BIN");
}

/** Whether `tier` runs here; a missing one fails under CORDON_REQUIRE_ALL=1. */
export function tierAvailable(tier) {
  const out = spawnSync(cordonBin(), ["doctor", "--json"], { encoding: "utf8", timeout: 60_000 });
  const tiers = Object.fromEntries(JSON.parse(out.stdout).map((t) => [t.tier, t.status]));
  const ok = tiers[tier] === "available" || tiers[tier] === "degraded";
  if (!ok) {
    const msg = `${tier} tier unavailable here`;
    if (process.env.CORDON_REQUIRE_ALL === "1") throw new Error(`${msg} and CORDON_REQUIRE_ALL=1`);
    console.error(`SKIPPING ${tier}-tier TypeScript SDK tests: ${msg}`);
  }
  return ok;
}

/** A server on a fresh data dir; `extra` goes into [tenant_defaults]. */
export async function startServer({ pools = { wasm: 1 }, extra = "" } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "cordon-ts-sdk-"));
  const data = join(dir, "data");
  const config = join(dir, "cordon.toml");
  const keys = Object.entries(KEYS).map(([t, k]) => `[[keys]]\ntenant = "${t}"\nkey = "${k}"\n`).join("");
  const poolLines = Object.entries(pools).map(([t, n]) => `${t} = ${n}\n`).join("");
  writeFileSync(config,
    `data_dir = "${data}"\nbind = "127.0.0.1:0"\ndefault_tier = "wasm"\n${keys}` +
    `[edge]\ndashboard_operators = ["ops"]\n` +
    `[sessions]\nreap_interval = "100ms"\n` +
    `[tenant_defaults]\ntrust = "trusted"\ntiers = ["runtime", "wasm", "container", "gvisor", "microvm"]\n` +
    `${extra}[pools]\n${poolLines}`);
  const proc = spawn(cordonBin(), ["serve", "--config", config], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; });
  const lines = createInterface({ input: proc.stdout });
  const first = await new Promise((res) => {
    lines.once("line", res);
    proc.once("exit", () => res(""));
  });
  if (!first.includes("listening on")) {
    throw new Error(`cordon serve did not start: ${first} ${stderr}`);
  }
  const url = first.trim().split(" ").pop();
  return {
    url,
    async stop() {
      if (proc.exitCode === null) {
        const done = new Promise((res) => proc.once("exit", res));
        proc.kill("SIGTERM");
        await done;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
