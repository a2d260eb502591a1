// Cordon's JavaScript context driver: a long-lived Node.js for code cells, started in the
// sandbox as `node -e <this>` (a background exec, under every limit of the sandbox).
// Requests arrive on stdin, one JSON object a line; frames leave on stdout, one a line:
// "\x1ecordon " + JSON (see contexts/frames.rs). process.stdout/stderr writes (console
// included) become stream frames; bytes a child process writes to the inherited stdout
// pass through unframed and the host reads them as stdout. Cells run in this realm's
// global scope (vm.runInThisContext) with a timeout; everything here is in a closure.
(function () {
  'use strict';
  const fs = require('fs');
  const vm = require('vm');
  const util = require('util');
  const MARK = '\x1ecordon ';
  const st = { cell: 0, count: 0, busy: false, queue: [], timedOut: false, finish: null };

  function writeAll(buf) {
    let off = 0;
    while (off < buf.length) {
      try {
        off += fs.writeSync(1, buf, off, buf.length - off);
      } catch (e) {
        if (e.code !== 'EAGAIN') throw e;
      }
    }
  }
  function send(obj) {
    writeAll(Buffer.from(MARK + JSON.stringify(obj) + '\n', 'utf8'));
  }
  function stream(name) {
    return function (chunk, encoding, cb) {
      if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
      const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
      if (text.length) send({ t: 'stream', cell: st.cell, name, text });
      if (typeof cb === 'function') process.nextTick(cb);
      return true;
    };
  }
  process.stdout.write = stream('stdout');
  process.stderr.write = stream('stderr');

  const REPRS = [['_repr_png_', 'image/png'], ['_repr_jpeg_', 'image/jpeg'],
    ['_repr_svg_', 'image/svg+xml'], ['_repr_html_', 'text/html'],
    ['_repr_markdown_', 'text/markdown'], ['_repr_json_', 'application/json']];

  function bundle(value) {
    const data = {};
    if (value !== null && (typeof value === 'object' || typeof value === 'function')) {
      for (const [attr, mime] of REPRS) {
        const f = value[attr];
        if (typeof f !== 'function') continue;
        let v;
        try { v = f.call(value); } catch (_) { continue; }
        if (v === undefined || v === null) continue;
        if (Buffer.isBuffer(v) || v instanceof Uint8Array) v = Buffer.from(v).toString('base64');
        else if (typeof v !== 'string') v = JSON.stringify(v);
        data[mime] = v;
      }
    }
    data['text/plain'] = typeof value === 'string' ? value : util.inspect(value);
    return data;
  }

  // Dynamic import() in a cell loads as the main script would (relative to the cwd); Node
  // warns once that the option is experimental: that warning is the driver's, not the cell's.
  const LOADER = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;
  const emitWarning = process.emitWarning;
  process.emitWarning = function (w, ...rest) {
    if (String((w && w.message) || w).includes('USE_MAIN_CONTEXT_DEFAULT_LOADER')) return;
    return emitWarning.call(process, w, ...rest);
  };

  // ESM `import` declarations and top-level `await` in a cell, as E2B's JavaScript kernel
  // takes them: imports become `await import()`, then Node's own REPL rewrite (its acorn
  // and `internal/repl/await`, read from Node's built-in sources) turns the cell into an
  // async function whose top-level declarations stay global and whose last expression is
  // the value. Loaded the first time a cell needs it; `null` when this Node cannot.
  let esm;
  function loadEsm() {
    const natives = process.binding('natives');
    const primordials = new Proxy({}, { get(_, name) {
      const m = /^([A-Z][A-Za-z]*?)Prototype(Symbol)?([A-Z].*)$/.exec(name);
      if (m && globalThis[m[1]]) {
        const key = m[2] ? Symbol[m[3][0].toLowerCase() + m[3].slice(1)] : m[3][0].toLowerCase() + m[3].slice(1);
        const f = globalThis[m[1]].prototype[key];
        return (self, ...a) => f.apply(self, a);
      }
      const s = /^([A-Z][A-Za-z]*?)([A-Z][A-Za-z]*)$/.exec(name);
      const key = s && s[2][0].toLowerCase() + s[2].slice(1);
      if (s && globalThis[s[1]] && typeof globalThis[s[1]][key] === 'function') return globalThis[s[1]][key];
      return globalThis[name];
    } });
    const loaded = {};
    function load(id) {
      if (id === 'internal/repl') return { Recoverable: class Recoverable extends SyntaxError {} };
      if (loaded[id]) return loaded[id].exports;
      if (typeof natives[id] !== 'string') throw new Error(`no ${id} in this Node`);
      const module = { exports: {} };
      loaded[id] = module;
      vm.compileFunction(natives[id], ['exports', 'require', 'module', 'primordials', 'process'],
        { filename: id })(module.exports, load, module, primordials, process);
      return module.exports;
    }
    return { Parser: load('internal/deps/acorn/acorn/dist/acorn').Parser,
      rewrite: load('internal/repl/await').processTopLevelAwait };
  }
  function importAsAwait(node, code) {
    const from = code.slice(node.source.start, node.source.end);
    const named = [];
    let ns = null;
    for (const sp of node.specifiers) {
      if (sp.type === 'ImportNamespaceSpecifier') ns = sp.local.name;
      else if (sp.type === 'ImportDefaultSpecifier') named.push(`default: ${sp.local.name}`);
      else named.push(`${code.slice(sp.imported.start, sp.imported.end)}: ${sp.local.name}`);
    }
    if (ns) return `const ${ns} = await import(${from});` + (named.length ? ` const { ${named.join(', ')} } = ${ns};` : '');
    return named.length ? `const { ${named.join(', ')} } = await import(${from});` : `await import(${from});`;
  }
  function asAsync(code) {
    if (esm === undefined) {
      try { esm = loadEsm(); } catch (_) { esm = null; }
    }
    if (!esm) return null;
    try {
      let body;
      try {
        body = esm.Parser.parse(code, { ecmaVersion: 'latest', sourceType: 'module',
          allowAwaitOutsideFunction: true }).body;
      } catch (_) {
        body = [];
      }
      for (const node of body.filter((n) => n.type === 'ImportDeclaration').reverse()) {
        code = code.slice(0, node.start) + importAsAwait(node, code) + code.slice(node.end);
      }
      return esm.rewrite(code);
    } catch (_) {
      return null;
    }
  }

  // A cell's script: as written, or, when Node refuses it as a script, as E2B runs it.
  function compile(code, filename) {
    const opts = { filename, importModuleDynamically: LOADER };
    try {
      return { script: new vm.Script(code, opts), wrapped: false };
    } catch (e) {
      const rewritten = e instanceof SyntaxError ? asAsync(code) : null;
      if (!rewritten) throw e;
      return { script: new vm.Script(rewritten, opts), wrapped: true };
    }
  }

  globalThis.display = function display(...values) {
    for (const v of values) send({ t: 'display', cell: st.cell, data: bundle(v), main: false });
  };

  function errorOf(e) {
    if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
      return { name: e.name || 'Error', value: String(e.message), traceback: String(e.stack || e) };
    }
    return { name: 'Error', value: String(e), traceback: 'Uncaught ' + util.inspect(e) };
  }

  // A cell's own environment (run_code's envs): set while it runs, then the context's
  // values (or their absence) come back.
  function setEnv(env) {
    const saved = {};
    for (const [k, v] of Object.entries(env || {})) {
      saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
      process.env[k] = v;
    }
    st.savedEnv = saved;
  }

  function restoreEnv() {
    for (const [k, v] of Object.entries(st.savedEnv || {})) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
    st.savedEnv = null;
  }

  function done(cell, status, error) {
    if (st.cell !== cell || !st.busy) return;
    st.busy = false;
    restoreEnv();
    send({ t: 'done', cell, status, error: error || null, count: st.count });
    setImmediate(next);
  }

  function run(req) {
    const cell = req.cell;
    st.cell = cell;
    st.busy = true;
    st.count += 1;
    setEnv(req.env);
    // A cell the server could not turn into JavaScript (a TypeScript cell with a syntax
    // error) comes with its error: it is the cell's.
    if (req.error) return done(cell, 'error', req.error);
    const started = Date.now();
    let value;
    let wrapped = false;
    try {
      const c = compile(req.code, `<cell ${st.count}>`);
      wrapped = c.wrapped;
      value = c.script.runInThisContext({ timeout: req.timeout_ms, displayErrors: false });
    } catch (e) {
      if (e && (e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT' || e.code === 'ERR_SCRIPT_EXECUTION_TIMED_OUT')) {
        return done(cell, 'timeout', { name: 'TimeoutError',
          value: `the cell ran past its timeout of ${req.timeout_ms} ms and was interrupted; the context keeps its state`,
          traceback: '' });
      }
      return done(cell, 'error', errorOf(e));
    }
    const settle = (v) => {
      if (v !== undefined) {
        globalThis._ = v;
        send({ t: 'display', cell, data: bundle(v), main: true });
      }
      done(cell, 'ok', null);
    };
    if (value && typeof value.then === 'function') {
      const left = Math.max(1, req.timeout_ms - (Date.now() - started));
      const timer = setTimeout(() => done(cell, 'timeout', { name: 'TimeoutError',
        value: `the cell's promise did not settle within its timeout of ${req.timeout_ms} ms`,
        traceback: '' }), left);
      value.then((v) => {
        clearTimeout(timer);
        if (st.cell === cell && st.busy) settle(wrapped ? (v && v.value) : v);
      },
        (e) => { clearTimeout(timer); done(cell, 'error', errorOf(e)); });
    } else {
      settle(value);
    }
  }

  function next() {
    if (st.busy || st.queue.length === 0) return;
    run(st.queue.shift());
  }

  process.on('uncaughtException', (e) => {
    send({ t: 'stream', cell: st.cell, name: 'stderr',
      text: 'Uncaught ' + (e && e.stack ? e.stack : String(e)) + '\n' });
  });
  process.on('unhandledRejection', (e) => {
    send({ t: 'stream', cell: st.cell, name: 'stderr',
      text: 'Unhandled rejection: ' + (e && e.stack ? e.stack : String(e)) + '\n' });
  });

  let buf = '';
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const req = JSON.parse(buf.slice(0, i));
      buf = buf.slice(i + 1);
      if (req.op === 'interrupt') {
        if (st.busy && st.cell === req.cell) {
          done(req.cell, 'timeout', { name: 'TimeoutError',
            value: 'the cell was interrupted: it ran past its timeout', traceback: '' });
        }
      } else {
        st.queue.push(req);
      }
    }
    next();
  });
  process.stdin.on('end', () => process.exit(0));
  send({ t: 'ready', lang: 'javascript', version: process.version, pid: process.pid });
})();
