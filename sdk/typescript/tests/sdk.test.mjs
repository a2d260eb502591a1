// The TypeScript SDK against a real `cordon serve` (node's own test runner).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Cordon, CordonError, InvalidRequest, NotFound, PathRefused, PolicyDenied, Sandbox,
  TooManySandboxes, Unauthorized, Unsupported,
} from "../dist/index.js";
import { KEYS, startServer, tierAvailable } from "./server.mjs";

const text = (ev) => ("data" in ev ? ev.data : "");

async function collect(it) {
  const out = [];
  for await (const x of it) out.push(x);
  return out;
}

async function readAll(stream) {
  const parts = [];
  for await (const p of stream) parts.push(p);
  return Buffer.concat(parts);
}

describe("against cordon serve", () => {
  let server;
  let hasContainer;
  let alice;
  let bob;

  before(async () => {
    hasContainer = tierAvailable("container");
    server = await startServer({ pools: hasContainer ? { wasm: 1, container: 1 } : { wasm: 1 } });
    alice = new Cordon({ url: server.url, apiKey: KEYS.alice });
    bob = new Cordon({ url: server.url, apiKey: KEYS.bob });
  });

  after(async () => {
    await server?.stop();
  });

  test("the URL and key come from the environment; a wrong or missing key is refused", async () => {
    const saved = { url: process.env.CORDON_URL, key: process.env.CORDON_API_KEY };
    try {
      process.env.CORDON_URL = server.url;
      process.env.CORDON_API_KEY = KEYS.alice;
      const c = new Cordon();
      assert.equal(c.url, server.url);
      const h = await c.health();
      assert.equal(h.status, "ok");
      assert.ok(h.version && h.tiers?.wasm, JSON.stringify(h));
      assert.deepEqual(await c.listSandboxes(), []);
      process.env.CORDON_API_KEY = "ck_wrong_key_0123456789abcdef0123456789";
      const err = await new Cordon().listSandboxes().catch((e) => e);
      assert.ok(err instanceof Unauthorized && err instanceof CordonError, String(err));
      assert.equal(err.status, 401);
      assert.equal(err.code, "unauthorized");
      assert.ok(err.fix.length > 0);
      delete process.env.CORDON_API_KEY;
      assert.throws(() => new Cordon(), /CORDON_API_KEY/);
    } finally {
      process.env.CORDON_URL = saved.url ?? "";
      if (saved.key === undefined) delete process.env.CORDON_API_KEY;
      else process.env.CORDON_API_KEY = saved.key;
      if (saved.url === undefined) delete process.env.CORDON_URL;
    }
  });

  test("run, whole and streamed", async () => {
    const r = await alice.run("print(6*7)", { tier: "wasm" });
    assert.equal(r.termination, "exited");
    assert.equal(r.exit_code, 0);
    assert.equal(r.stdout, "42\n");
    assert.equal(r.tier, "wasm");
    assert.ok(r.usage.wall_time_us > 0 && r.timings.run_us > 0);
    const withFile = await alice.run("print(open('/work/in.txt').read())", {
      tier: "wasm", files: { "/work/in.txt": "from a file" },
    });
    assert.equal(withFile.stdout, "from a file\n");
    const evs = await collect(alice.runStream("import sys; print('o'); print('e', file=sys.stderr)", { tier: "wasm" }));
    assert.equal(evs.at(-1).type, "outcome");
    assert.equal(evs.at(-1).outcome.exit_code, 0);
    assert.equal(evs.filter((e) => e.type === "stdout").map(text).join(""), "o\n");
    assert.equal(evs.filter((e) => e.type === "stderr").map(text).join(""), "e\n");
  });

  test("a sandbox's lifecycle, execs whole and streamed, files and the audit", async () => {
    const sb = await alice.createSandbox({ tier: "wasm", ttl: "2m", labels: { run: "ts" }, limits: { disk_bytes: 64 << 20 } });
    assert.ok(sb instanceof Sandbox);
    assert.equal(sb.info.state, "live");
    assert.deepEqual(sb.info.labels, { run: "ts" });
    try {
      assert.deepEqual((await alice.listSandboxes({ run: "ts" })).map((s) => s.id), [sb.id]);
      assert.deepEqual(await alice.listSandboxes({ run: "other" }), []);
      assert.equal((await alice.getSandbox(sb.id)).info.tier, "wasm");

      // A stream of bytes goes up as it is read; it comes back whole, and as a stream.
      const chunk = new Uint8Array(64 << 10).map((_, i) => i % 251);
      async function* chunks() {
        for (let i = 0; i < 32; i++) yield chunk;
      }
      const w = await sb.writeFile("/work/big.bin", chunks());
      assert.deepEqual(w, { path: "/work/big.bin", bytes: 32 * chunk.length });
      const back = await sb.readFile("/work/big.bin");
      assert.equal(back.length, 32 * chunk.length);
      assert.deepEqual(back.subarray(chunk.length, 2 * chunk.length), chunk);
      const streamed = await readAll(await sb.readFileStream("/work/big.bin"));
      assert.equal(Buffer.compare(streamed, Buffer.from(back)), 0);

      await sb.writeFile("/work/a.csv", "x\n1\n2\n", { mode: 0o600 });
      assert.equal(await sb.readText("/work/a.csv"), "x\n1\n2\n");
      const r = await sb.exec("print(sum(1 for _ in open('/work/a.csv')))", { lang: "python" });
      assert.equal(r.stdout, "3\n");
      const echoed = await sb.exec("import sys; print(sys.stdin.read().upper())", { lang: "python", stdin: "hi" });
      assert.equal(echoed.stdout, "HI\n");
      const evs = await collect(sb.execStream("import sys; print('out'); print('err', file=sys.stderr)", { lang: "python" }));
      assert.equal(evs.at(-1).type, "outcome");
      assert.equal(evs.at(-1).outcome.termination, "exited");
      assert.equal(evs.filter((e) => e.type === "stdout").map(text).join(""), "out\n");
      assert.equal(evs.filter((e) => e.type === "stderr").map(text).join(""), "err\n");

      const st = await sb.files.stat("/work/a.csv");
      assert.deepEqual([st.kind, st.size, st.mode, st.path], ["file", 6, 0o600, "/work/a.csv"]);
      assert.equal((await sb.files.mkdir("/work/d/e", { parents: true })).op, "mkdir");
      const moved = await sb.files.rename("/work/a.csv", "/work/d/e/a.csv");
      assert.equal(moved.to, "/work/d/e/a.csv");
      assert.deepEqual((await sb.files.list("/work/d/e")).map((e) => [e.name, e.kind, e.size]), [["a.csv", "file", 6]]);
      // A directory out as a tar stream and back in elsewhere.
      const tar = await readAll(await sb.files.downloadArchive("/work/d"));
      assert.ok(tar.length >= 1024 && tar.length % 512 === 0, String(tar.length));
      const rep = await sb.files.uploadArchive(new Uint8Array(tar), "/work/copy");
      assert.equal(rep.files, 1);
      assert.equal(await sb.readText("/work/copy/e/a.csv"), "x\n1\n2\n");
      assert.equal((await sb.files.remove("/work/copy", { recursive: true })).op, "remove");
      assert.deepEqual((await sb.files.listing("/work")).entries.map((e) => e.name), ["big.bin", "d"]);

      // Errors by code.
      await assert.rejects(sb.readFile("/proc/self/environ"), PathRefused);
      await assert.rejects(sb.writeFile("/work/../proc/x", "no"), PathRefused);
      await assert.rejects(bob.sandboxHandle(sb.id).exec("echo no"), NotFound);
      await assert.rejects(bob.getSandbox(sb.id), NotFound);
      await assert.rejects(sb.pause(), (e) => e instanceof Unsupported && e.fix.includes("container"));
      await assert.rejects(alice.request("POST", "/v1/sandboxes", { tier: "wasm", privileged: true }), InvalidRequest);
      const denied = await alice.createSandbox({ tier: "wasm", allow_hosts: ["example.test"] }).catch((e) => e);
      assert.ok(denied instanceof PolicyDenied, String(denied));
      assert.equal(denied.status, 403);
      assert.ok(denied.rule, JSON.stringify(denied));
      const moved2 = await sb.update({ ttl: "5m" });
      assert.ok(moved2.expires_ms > sb.info.created_ms);
    } finally {
      const d = await sb.destroy();
      assert.equal(d.already, false);
    }
    assert.equal((await sb.destroy()).already, true);
    await assert.rejects(alice.getSandbox(sb.id), NotFound);
    const kinds = new Set((await alice.audit({ sandbox: sb.id, limit: 1000 })).map((e) => e.kind));
    for (const k of ["create", "exec", "file_put", "file_get", "file_op", "destroy"]) {
      assert.ok(kinds.has(k), `${k} not in ${[...kinds]}`);
    }
    assert.ok((await bob.audit({ sandbox: sb.id })).length === 0);
  });

  test("metrics and the minted tokens' documents", async () => {
    // The server-wide figures are the operator's (issue 44): a tenant's key is refused.
    await assert.rejects(alice.metrics(), (e) => e.status === 403);
    const ops = new Cordon({ url: server.url, apiKey: KEYS.ops });
    const m = await ops.metrics();
    assert.ok(m.includes("cordon_pool_ready") && m.trimEnd().endsWith("# EOF"), m.slice(-300));
    const conf = await alice.openidConfiguration();
    assert.ok(conf.issuer && conf.jwks_uri.endsWith("/.well-known/jwks.json"), JSON.stringify(conf));
    assert.ok(conf.id_token_signing_alg_values_supported.includes("ES256"));
    const { keys } = await alice.jwks();
    assert.ok(keys.length > 0 && keys.every((k) => k.kty === "EC" && k.kid), JSON.stringify(keys));
    assert.deepEqual(await alice.introspectToken("eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"), { active: false });
  });

  test("a sandbox's metrics: its samples, a range, not another tenant's (container)", async (t) => {
    if (!hasContainer) {
      t.skip("container tier unavailable here (see the SKIPPING line)");
      return;
    }
    await alice.withSandbox({ tier: "container" }, async (sb) => {
      // One sample every 5 s: wait for the first (bounded), then read it as the spec says.
      let samples = [];
      for (let i = 0; i < 40 && samples.length === 0; i++) {
        samples = await sb.metrics();
        if (samples.length === 0) await new Promise((r) => setTimeout(r, 500));
      }
      assert.ok(samples.length > 0, "no sample in 20 s");
      const [m] = samples;
      assert.deepEqual(Object.keys(m).sort(), ["at_ms", "cpu_count", "cpu_used_pct", "disk_total", "disk_used", "mem_cache", "mem_total", "mem_used"]);
      assert.ok(m.cpu_count >= 1 && m.mem_total > 0 && m.mem_used > 0, JSON.stringify(m));
      assert.deepEqual(await sb.metrics({ start_ms: m.at_ms + 1, end_ms: m.at_ms + 1 }), []);
      assert.deepEqual((await sb.metrics({ start_ms: m.at_ms, end_ms: m.at_ms }))[0], m);
      await assert.rejects(sb.metrics({ start_ms: 2, end_ms: 1 }), InvalidRequest);
      await assert.rejects(bob.sandboxHandle(sb.id).metrics(), NotFound);
    });
  });

  test("volumes: made, mounted, kept, refused while mounted, deleted (container)", async (t) => {
    if (!hasContainer) {
      t.skip("container tier unavailable here (see the SKIPPING line)");
      return;
    }
    const name = `ts-${process.pid}`;
    const v = await alice.createVolume(name, "16M");
    assert.equal(v.name, name);
    assert.equal(v.size, 16 << 20);
    try {
      await assert.rejects(alice.createVolume(name, "16M"), (e) => e.code === "volume_exists");
      await alice.withSandbox({ tier: "container", volumes: [`${name}:/work/v`] }, async (sb) => {
        assert.equal((await sb.exec("echo kept > /work/v/f && cat /work/v/f")).stdout, "kept\n");
        assert.deepEqual((await alice.volume(name)).mounts.map((m) => [m.sandbox, m.read_only]), [[sb.id, false]]);
        await assert.rejects(alice.deleteVolume(name), (e) => e.code === "volume_in_use");
      });
      await alice.withSandbox({ tier: "container", volumes: [{ name, path: "/work/ro", read_only: true }] }, async (sb) => {
        assert.equal((await sb.exec("cat /work/ro/f")).stdout, "kept\n");
        assert.notEqual((await sb.exec("echo x > /work/ro/g")).exit_code, 0);
      });
      const listed = await alice.volumes();
      assert.ok(listed.volumes.some((x) => x.name === name) && listed.quota_bytes > 0, JSON.stringify(listed));
      assert.deepEqual((await bob.volumes()).volumes.filter((x) => x.name === name), []);
      await assert.rejects(bob.volume(name), NotFound);
    } finally {
      assert.deepEqual(await alice.deleteVolume(name), { name, deleted: true });
    }
  });

  test("snapshots: taken, forked, started from, not another tenant's, deleted (container)", async (t) => {
    if (!hasContainer) {
      t.skip("container tier unavailable here (see the SKIPPING line)");
      return;
    }
    const name = `ts-snap-${process.pid}`;
    let snap;
    await alice.withSandbox({ tier: "container", limits: { disk_bytes: 16 << 20 } }, async (sb) => {
      await sb.writeFile("/work/f", "before");
      snap = await sb.createSnapshot({ name, mode: "filesystem" });
      assert.deepEqual([snap.tier, snap.mode, snap.source, snap.name], ["container", "filesystem", sb.id, name]);
      await assert.rejects(sb.createSnapshot({ mode: "full" }), Unsupported);
      const forks = await sb.fork(2);
      try {
        assert.equal(forks.length, 2);
        for (const f of forks) {
          assert.ok(f instanceof Sandbox, String(f));
          assert.equal(new TextDecoder().decode(await f.readFile("/work/f")), "before");
        }
      } finally {
        for (const f of forks) if (f instanceof Sandbox) await f.destroy();
      }
    });
    try {
      const [again] = await alice.startFromSnapshot(name, 1, { ttl: "1m" });
      assert.ok(again instanceof Sandbox, String(again));
      assert.equal(new TextDecoder().decode(await again.readFile("/work/f")), "before");
      await again.destroy();
      assert.ok((await alice.snapshots()).some((s) => s.id === snap.id));
      assert.deepEqual((await bob.snapshots()).filter((s) => s.id === snap.id), []);
      await assert.rejects(bob.startFromSnapshot(snap.id), NotFound);
      await assert.rejects(bob.deleteSnapshot(name), NotFound);
    } finally {
      await alice.deleteSnapshot(snap.id);
    }
    await assert.rejects(alice.snapshot(name), NotFound);
  });

  test("timeoutMs bounds a whole call, and a stream only until its head", async () => {
    const quick = new Cordon({ url: server.url, apiKey: KEYS.alice, timeoutMs: 1500 });
    await quick.withSandbox({ tier: "wasm" }, async (sb) => {
      const code = "import time\nprint('a', flush=True)\ntime.sleep(2.5)\nprint('b')";
      const evs = await collect(sb.execStream(code, { lang: "python" }));
      assert.equal(evs.filter((e) => e.type === "stdout").map(text).join(""), "a\nb\n");
      assert.equal(evs.at(-1).outcome.termination, "exited");
      // (Last: a wasm exec whose client left runs on to its end, holding the sandbox.)
      await assert.rejects(sb.exec(code, { lang: "python" }), (e) => e.name === "TimeoutError");
    });
  });

  test("background execs and code contexts (container)", async (t) => {
    if (!hasContainer) {
      t.skip("container tier unavailable here (see the SKIPPING line)");
      return;
    }
    await alice.withSandbox({ tier: "container", ttl: "5m" }, async (sb) => {
      const cat = await sb.execBackground(["cat"]);
      assert.match(cat.id, /^ex-\d+$/);
      assert.equal(cat.info.state, "running");
      assert.equal((await cat.sendStdin("hello\n")).bytes, 6);
      await cat.sendStdin(new TextEncoder().encode("bytes\n"), { close: true });
      const end = await cat.wait();
      assert.equal(end.exit_code, 0);
      assert.equal(end.stdout, "hello\nbytes\n");
      const replay = await collect(cat);
      assert.equal(replay.filter((e) => e.type === "stdout").map(text).join(""), "hello\nbytes\n");
      assert.equal(replay.at(-1).type, "outcome");
      const sleeper = await sb.execBackground("sleep 600");
      assert.equal((await sleeper.status()).state, "running");
      await sleeper.kill({ force: true });
      assert.equal((await sleeper.wait()).termination, "killed");
      assert.deepEqual((await sb.execs()).map((e) => e.id), [cat.id, sleeper.id]);
      await assert.rejects(cat.resize({ rows: 30, cols: 100 }), Unsupported);

      await sb.runCode("x = 41");
      const r = await sb.runCode("x + 1");
      assert.equal(r.status, "ok");
      assert.equal(r.text, "42");
      const seen = [];
      const live = await sb.runCode("print('live')\n7", { onStdout: (s) => seen.push(s) });
      assert.equal(live.text, "7");
      assert.equal(seen.join(""), "live\n");
      const ctx = await sb.createContext("python");
      assert.equal((await ctx.run("1 + 1")).text, "2");
      const timedOut = await ctx.run("import time\ntime.sleep(30)", { timeout: "1s" });
      assert.equal(timedOut.status, "timeout");
      assert.equal((await ctx.restart()).restarts, 1);
      assert.equal((await ctx.close()).state, "deleted");
      assert.deepEqual((await sb.contexts()).map((c) => c.info.default), [true]);

      const paused = await sb.pause();
      assert.equal(paused.state, "paused");
      await assert.rejects(sb.exec("echo no"), (e) => e.code === "sandbox_paused");
      assert.equal((await sb.resume()).state, "live");
      assert.equal((await sb.exec(["echo", "back"])).stdout, "back\n");
    });
  });
});

test("a 429 with Retry-After is sent once more, and only once", async () => {
  // One sandbox per tenant: a second create is refused with 429 and Retry-After (1 s).
  const server = await startServer({ pools: {}, extra: "max_sandboxes = 1\n" });
  try {
    const creates = [];
    let held = null;
    const counting = async (url, init) => {
      const resp = await fetch(url, init);
      if (init.method === "POST" && new URL(url).pathname === "/v1/sandboxes") {
        creates.push(resp.status);
        if (resp.status === 429 && held) {
          const h = held;
          held = null;
          await h.destroy(); // frees the place before the retry
        }
      }
      return resp;
    };
    const c = new Cordon({ url: server.url, apiKey: KEYS.alice, fetch: counting });
    const other = new Cordon({ url: server.url, apiKey: KEYS.alice });
    held = other.sandboxHandle((await c.createSandbox({ tier: "wasm" })).id);
    const second = await c.createSandbox({ tier: "wasm" });
    assert.deepEqual(creates, [201, 429, 201]);
    creates.length = 0;
    const err = await c.createSandbox({ tier: "wasm" }).catch((e) => e);
    assert.ok(err instanceof TooManySandboxes, String(err));
    assert.equal(err.retryAfter, 1);
    assert.deepEqual(creates, [429, 429]);
    creates.length = 0;
    const noRetry = new Cordon({ url: server.url, apiKey: KEYS.alice, retries: 0, fetch: counting });
    await assert.rejects(noRetry.createSandbox({ tier: "wasm" }), TooManySandboxes);
    assert.deepEqual(creates, [429]);
    await second.destroy();
  } finally {
    await server.stop();
  }
});
