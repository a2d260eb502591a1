// The package as a user gets it: `npm install ./sdk/typescript` into a fresh project, the
// README's example run as written (and type-checked against the package's .d.ts), and
// dist/ equal to what tsc makes of src/.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, test } from "node:test";

import { KEYS, ROOT, startServer, tierAvailable } from "./server.mjs";

const PKG = resolve(ROOT, "sdk/typescript");
const TSC = join(PKG, "node_modules/typescript/bin/tsc");

function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", timeout: 300_000, ...opts });
  assert.equal(r.status, 0, `${cmd} ${args.join(" ")}: ${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

test("dist/ is what tsc makes of src/", () => {
  const out = mkdtempSync(join(tmpdir(), "cordon-ts-dist-"));
  try {
    run(process.execPath, [TSC, "-p", join(PKG, "tsconfig.json"), "--outDir", out]);
    const fresh = readdirSync(out).sort();
    assert.deepEqual(readdirSync(join(PKG, "dist")).sort(), fresh);
    for (const f of fresh) {
      assert.equal(readFileSync(join(PKG, "dist", f), "utf8"), readFileSync(join(out, f), "utf8"),
        `dist/${f} differs from a fresh build: run \`npm run build\` in sdk/typescript`);
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

let server;
before(async () => {
  server = await startServer({ pools: { wasm: 1, container: 1 } });
});
after(async () => {
  await server?.stop();
});

test("npm install ./sdk/typescript, then the README's example as written", async (t) => {
  if (!tierAvailable("container")) {
    t.skip("the README's example uses the container tier (see the SKIPPING line)");
    return;
  }
  const app = mkdtempSync(join(tmpdir(), "cordon-ts-app-"));
  try {
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", type: "module", private: true }));
    // --offline: the package has no dependency to fetch.
    run("npm", ["install", "--offline", "--no-audit", "--no-fund", "--no-package-lock", PKG], { cwd: app });
    const blocks = [...readFileSync(join(PKG, "README.md"), "utf8").matchAll(/```js\n([\s\S]*?)```/g)];
    assert.equal(blocks.length, 1, "the README has one JavaScript example");
    writeFileSync(join(app, "example.mjs"), blocks[0][1]);
    // Its types: the example, checked as JavaScript against the installed package's .d.ts.
    writeFileSync(join(app, "tsconfig.json"), JSON.stringify({
      compilerOptions: {
        noEmit: true, allowJs: true, checkJs: true, strict: true, target: "ES2022", module: "NodeNext",
        moduleResolution: "NodeNext", lib: ["ES2022", "DOM", "DOM.Iterable", "DOM.AsyncIterable"], types: [],
      },
      files: ["example.mjs"],
    }));
    run(process.execPath, [TSC, "-p", join(app, "tsconfig.json")], { cwd: app });
    const out = run(process.execPath, ["example.mjs"], {
      cwd: app, env: { ...process.env, CORDON_URL: server.url, CORDON_API_KEY: KEYS.alice },
    });
    const lines = out.trim().split("\n");
    assert.equal(lines[0], "42");
    for (const want of ["exited 0 3", "stdout one", "stderr two", "outcome exited",
      "[ [ 'a.csv', 'file', 6 ] ]", "[ 'ex-1' ] ex-1", "42", "not_found true"]) {
      assert.ok(lines.includes(want), `${want} not in:\n${out}`);
    }
  } finally {
    rmSync(app, { recursive: true, force: true });
  }
});
