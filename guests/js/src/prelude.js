// Cordon's console for QuickJS. Evaluated to a function and called with one host function,
// `write(fd, text)`, which is the only way out of the interpreter: 1 is stdout, 2 is stderr.
// Shared by the wasm tier's JavaScript guest and the in-process runtime tier, so both print
// values the same way (close to Node's `util.inspect`).
(function (write) {
  "use strict";
  const MAX_DEPTH = 2;
  const MAX_ITEMS = 100;

  function quote(s) {
    return "'" + s.replace(/\\/g, "\\\\").replace(/'/g, "\\'").replace(/\n/g, "\\n") + "'";
  }

  function key(k) {
    return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(k) ? k : quote(k);
  }

  function list(open, items, close, more) {
    if (more > 0) items.push("... " + more + " more item" + (more > 1 ? "s" : ""));
    if (items.length === 0) return open + close;
    const flat = open + " " + items.join(", ") + " " + close;
    return flat;
  }

  function inspect(v, depth, seen, nested) {
    switch (typeof v) {
      case "string":
        return nested ? quote(v) : v;
      case "number":
        return Object.is(v, -0) ? "-0" : String(v);
      case "bigint":
        return String(v) + "n";
      case "undefined":
        return "undefined";
      case "boolean":
        return String(v);
      case "symbol":
        return v.toString();
      case "function":
        return v.name ? "[Function: " + v.name + "]" : "[Function (anonymous)]";
    }
    if (v === null) return "null";
    if (seen.indexOf(v) >= 0) return "[Circular]";
    if (v instanceof Error) {
      const head = v.name + ": " + v.message;
      return v.stack ? head + "\n" + String(v.stack).replace(/\n$/, "") : head;
    }
    if (v instanceof Date) return isNaN(v.getTime()) ? "Invalid Date" : v.toISOString();
    if (v instanceof RegExp) return String(v);
    if (v instanceof Promise) return "Promise {}";
    if (depth > MAX_DEPTH) {
      if (Array.isArray(v)) return "[Array]";
      return "[Object]";
    }
    seen.push(v);
    try {
      const inner = (x) => inspect(x, depth + 1, seen, true);
      if (Array.isArray(v) || ArrayBuffer.isView(v)) {
        const n = Math.min(v.length, MAX_ITEMS);
        const items = [];
        for (let i = 0; i < n; i++) items.push(inner(v[i]));
        const prefix = Array.isArray(v) ? "" : v.constructor.name + "(" + v.length + ") ";
        return prefix + list("[", items, "]", v.length - n);
      }
      if (v instanceof Map) {
        const items = [];
        for (const [k, x] of v) {
          if (items.length >= MAX_ITEMS) break;
          items.push(inner(k) + " => " + inner(x));
        }
        return "Map(" + v.size + ") " + list("{", items, "}", v.size - items.length);
      }
      if (v instanceof Set) {
        const items = [];
        for (const x of v) {
          if (items.length >= MAX_ITEMS) break;
          items.push(inner(x));
        }
        return "Set(" + v.size + ") " + list("{", items, "}", v.size - items.length);
      }
      const keys = Object.keys(v);
      const items = [];
      for (const k of keys.slice(0, MAX_ITEMS)) items.push(key(k) + ": " + inner(v[k]));
      const proto = Object.getPrototypeOf(v);
      const name = proto && proto.constructor && proto.constructor.name;
      const prefix = name && name !== "Object" ? name + " " : proto === null ? "[Object: null prototype] " : "";
      return prefix + list("{", items, "}", keys.length - Math.min(keys.length, MAX_ITEMS));
    } finally {
      seen.pop();
    }
  }

  function format(args) {
    const parts = [];
    for (let i = 0; i < args.length; i++) parts.push(inspect(args[i], 0, [], false));
    return parts.join(" ");
  }

  const out = (fd) => function () {
    write(fd, format(arguments) + "\n");
  };
  globalThis.console = Object.freeze({
    log: out(1),
    info: out(1),
    debug: out(1),
    warn: out(2),
    error: out(2),
    trace: out(2),
  });
  return (v) => inspect(v, 0, [], true);
})
