// E2B's own published JavaScript SDKs (`e2b` and `@e2b/code-interpreter`, pinned by
// package-lock.json, installed by scripts/setup.d/46-e2b-sdks.sh) run their quick-start
// flows unchanged against a real `cordon serve` with its [e2b] listener on loopback
// (docs/e2b.md). Every byte stays here: the SDK's URLs are set to the loopback listener
// before the SDK is imported (a dynamic import below).
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, test } from "node:test";

import { startServer, tierAvailable } from "../typescript/tests/server.mjs";

const TIER = process.env.CORDON_E2B_TIER || "container";
const E2B_KEY = "e2b_" + "0123456789abcdef".repeat(2) + "01234567";

async function freePort() {
  const s = createServer();
  await new Promise((res) => s.listen(0, "127.0.0.1", res));
  const { port } = s.address();
  await new Promise((res) => s.close(res));
  return port;
}

// The SDK reads these at each call: a port taken by another process between the pick and
// the server's bind is picked again below, and they follow.
function pointAt(port) {
  const origin = `http://127.0.0.1:${port}`;
  process.env.E2B_API_URL = origin;
  process.env.E2B_SANDBOX_URL = origin;
}
let port = await freePort();
pointAt(port);
process.env.E2B_DOMAIN = "localhost";
process.env.E2B_API_KEY = E2B_KEY;
delete process.env.E2B_DEBUG;
const { Sandbox, CommandExitError, TimeoutError } = await import("e2b");
const CI = await import("@e2b/code-interpreter");

let server;
const available = tierAvailable(TIER);
before(async () => {
  if (!available) return;
  // A free port is only free until something else binds it (CI runs other suites beside
  // this one): a start that found it taken tries another, a few times.
  for (let attempt = 1; ; attempt++) {
    try {
      server = await startServer({
        pools: {},
        extra: `[[keys]]\ntenant = "alice"\nkey = "${E2B_KEY}"\n[e2b]\nlisten = "127.0.0.1:${port}"\ntier = "${TIER}"\n`,
      });
      return;
    } catch (e) {
      if (attempt >= 5 || !String(e.message).includes("Address already in use")) throw e;
      port = await freePort();
      pointAt(port);
    }
  }
});
after(async () => {
  await server?.stop();
});

test(`commands, PTY and files through E2B's JS SDK (${TIER})`, { timeout: 240_000 }, async (t) => {
  if (!available) return t.skip(`${TIER} tier unavailable here`);
  const sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { suite: "e2b-js" } });
  try {
    const r = await sbx.commands.run("echo hello; echo oops >&2");
    assert.equal(r.stdout, "hello\n");
    assert.equal(r.stderr, "oops\n");
    await assert.rejects(sbx.commands.run("exit 3"), (e) => e instanceof CommandExitError && e.exitCode === 3);
    const bg = await sbx.commands.run("sleep 0.5; echo done", { background: true });
    assert.equal((await bg.wait()).stdout, "done\n");
    const long = await sbx.commands.run("sleep 60", { background: true });
    assert.ok((await sbx.commands.list()).some((p) => p.pid === long.pid));
    assert.equal(await long.kill(), true);
    await assert.rejects(long.wait(), CommandExitError);
    const cat = await sbx.commands.run("cat", { background: true, stdin: true });
    await sbx.commands.sendStdin(cat.pid, "to stdin\n");
    await sbx.commands.closeStdin(cat.pid);
    assert.equal((await cat.wait()).stdout, "to stdin\n");
    await assert.rejects(sbx.commands.run("sleep 30", { timeoutMs: 1000 }), TimeoutError);

    let out = "";
    const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d); }, timeoutMs: 30_000 });
    await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 });
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size; echo pty-$((40+2)); exit\n"));
    await pty.wait();
    assert.match(out, /pty-42/);
    assert.match(out, /30 100/);

    await sbx.files.write("/home/user/hello.txt", "hello file");
    assert.equal(await sbx.files.read("/home/user/hello.txt"), "hello file");
    assert.equal((await sbx.commands.run("cat /home/user/hello.txt")).stdout, "hello file");
    assert.equal(await sbx.files.makeDir("/home/user/d"), true);
    assert.equal(await sbx.files.makeDir("/home/user/d"), false);
    assert.deepEqual((await sbx.files.list("/home/user")).map((e) => e.name).filter((n) => !n.startsWith(".")).sort(), ["d", "hello.txt"]);
    assert.equal(await sbx.files.exists("/home/user/hello.txt"), true);
    await sbx.files.rename("/home/user/hello.txt", "/home/user/moved.txt");
    assert.equal(await sbx.files.exists("/home/user/hello.txt"), false);
    await sbx.files.remove("/home/user/moved.txt");
    assert.equal(await sbx.files.exists("/home/user/moved.txt"), false);

    await sbx.setTimeout(60_000);
    const info = await sbx.getInfo();
    const left = (info.endAt.getTime() - Date.now()) / 1000;
    assert.ok(left > 30 && left <= 62, `${left}`);
    const listed = await Sandbox.list().nextItems();
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId));
    await sbx.files.write("kept.txt", "kept");
    assert.equal(await sbx.pause(), true);
    assert.equal(await sbx.isRunning(), false);
    const again = await Sandbox.connect(sbx.sandboxId);
    assert.equal(await again.isRunning(), true);
    assert.equal(await again.files.read("kept.txt"), "kept");
  } finally {
    await sbx.kill();
  }
  const listed = await Sandbox.list().nextItems();
  assert.ok(!listed.some((s) => s.sandboxId === sbx.sandboxId));
});

test(`run_code keeps state and returns a matplotlib PNG (${TIER})`, { timeout: 240_000 }, async (t) => {
  if (!available) return t.skip(`${TIER} tier unavailable here`);
  const sbx = await CI.Sandbox.create({ timeoutMs: 300_000 });
  try {
    const ex = await sbx.runCode("x = 41\nprint('side')\nx + 1");
    assert.equal(ex.error, undefined);
    assert.deepEqual(ex.logs.stdout, ["side\n"]);
    assert.equal(ex.text, "42");
    assert.equal((await sbx.runCode("x * 2")).text, "82");
    const plot = await sbx.runCode(
      "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()");
    assert.equal(plot.error, undefined);
    assert.ok(plot.results.some((r) => r.png?.startsWith("iVBORw0KGgo")));
    const err = await sbx.runCode("1 / 0");
    assert.equal(err.error?.name, "ZeroDivisionError");
    const js = await sbx.runCode("const a = 20; a + 22", { language: "javascript" });
    assert.equal(js.text, "42");
    const ctx = await sbx.createCodeContext({ language: "python" });
    assert.equal((await sbx.runCode("y = 5", { context: ctx })).error, undefined);
    assert.equal((await sbx.runCode("y + 1", { context: ctx })).text, "6");
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
    await sbx.removeCodeContext(ctx);
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  } finally {
    await sbx.kill();
  }
});

test(`snapshots and fork through E2B's JS SDK (${TIER})`, { timeout: 240_000 }, async (t) => {
  if (!available) return t.skip(`${TIER} tier unavailable here`);
  const src = await Sandbox.create({ timeoutMs: 120_000 });
  try {
    await src.files.write("/home/user/state.txt", "before");
    const info = await src.createSnapshot({ name: "js-snap" });
    assert.ok(info.snapshotId.startsWith("snap-"), JSON.stringify(info));
    assert.deepEqual(info.names, ["js-snap"]);
    await src.files.write("/home/user/state.txt", "source-after");
    const fromSnap = await Sandbox.create(info.snapshotId, { timeoutMs: 60_000 });
    try {
      assert.equal(await fromSnap.files.read("/home/user/state.txt"), "before");
    } finally {
      await fromSnap.kill();
    }
    const listed = await Sandbox.listSnapshots().nextItems();
    assert.deepEqual(listed.map((s) => s.snapshotId), [info.snapshotId]);
    const forks = await src.fork({ count: 3, timeoutMs: 60_000 });
    try {
      assert.equal(forks.length, 3);
      for (const f of forks) {
        assert.ok(f instanceof Sandbox, String(f));
        assert.equal(await f.files.read("/home/user/state.txt"), "source-after");
      }
      await forks[0].files.write("/home/user/state.txt", "fork-0");
      assert.equal(await forks[1].files.read("/home/user/state.txt"), "source-after");
    } finally {
      for (const f of forks) if (f instanceof Sandbox) await f.kill();
    }
    assert.equal(await Sandbox.deleteSnapshot(info.snapshotId), true);
    assert.equal(await Sandbox.deleteSnapshot(info.snapshotId), false);
    assert.deepEqual(await Sandbox.listSnapshots().nextItems(), []);
  } finally {
    await src.kill();
  }
});

test(`a command waited on when its sandbox is killed raises the sandbox-killed error (${TIER})`, { timeout: 120_000 }, async (t) => {
  // As under E2B (E2B's suite: sandbox/commands/sandboxKilledDuringRun.test.ts): the command's
  // stream breaks off, the SDK asks /health (502) and says the sandbox was killed. The JS SDK
  // asks only when the stream breaks; an `unavailable` end message read as a timeout.
  if (!available) return t.skip(`${TIER} tier unavailable here`);
  const sbx = await Sandbox.create({ timeoutMs: 60_000 });
  const cmd = await sbx.commands.run("sleep 60", { background: true });
  await sbx.kill();
  const err = await cmd.wait().then(() => null, (e) => e);
  assert.ok(err instanceof TimeoutError, String(err));
  assert.match(err.message, /sandbox was killed or reached its end of life/);
});
