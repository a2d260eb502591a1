// The SDK's types against docs/openapi.json, field by field (issue 50, ADR 0033). The types
// are written by hand (src/models.ts, src/errors.ts); this test reads them with the
// TypeScript compiler's own checker and holds them to the spec the server generates: every
// property of each schema the SDK models is a property of its type (or listed below as
// read another way, with the reason), of the same type (a word's literals exactly the
// spec's), optional or `| null` where the spec may leave it out or send null; every error
// code of the spec has its class. A property, schema or code the spec gains fails here
// until the SDK has it (or says here why not). No server is needed.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { test } from "node:test";

import { ROOT } from "./server.mjs";

const PKG = resolve(ROOT, "sdk/typescript");
const ts = createRequire(import.meta.url)(join(PKG, "node_modules/typescript"));
const SPEC = JSON.parse(readFileSync(join(ROOT, "docs/openapi.json"), "utf8"));
const SCHEMAS = SPEC.components.schemas;

// Each answer schema and the type that models it.
const MODELS = {
  ArchiveReport: "ArchiveReport",
  CellResult: "CellResult",
  ContextInfo: "ContextInfo",
  Destroyed: "Destroyed",
  Details: "Details",
  Discovery: "OidcConfiguration",
  Done: "FileDone",
  EgressEvent: "EgressEvent",
  Event: "AuditEvent",
  ExecInfo: "ExecInfo",
  ExecOutcome: "ExecResult",
  FileEntry: "FileEntry",
  FileWritten: "FileWritten",
  Finding: "Finding",
  Health: "Health",
  Introspection: "TokenInfo",
  Jwks: "Jwks",
  Limits: "Limits",
  LimitsPatch: "Limits",
  Listing: "Listing",
  MetricSample: "MetricSample",
  PtySize: "PtySize",
  SandboxInfo: "SandboxInfo",
  SandboxList: "SandboxList",
  SnapshotInfo: "Snapshot",
  StartedFromSnapshot: "SnapshotStarts",
  Stat: "FileEntry",
  StdinWritten: "StdinWritten",
  Timings: "Timings",
  Usage: "Usage",
  VolumeDeleted: "VolumeDeleted",
  VolumeInfo: "Volume",
  VolumeList: "VolumeList",
  // Request bodies a type of the SDK's describes.
  SandboxRequest: "SandboxSpec",
  VolumeRequest: "VolumeMount",
  RunRequest: "RunOptions",
  ExecBody: "ExecOptions",
  StartFromSnapshotRequest: "StartOptions",
};

// Properties a type takes or gives another way: "Schema.property" -> why.
const OTHERWISE = {
  "Event.detail": "the row's detail as JSON: its shape is the kind's",
  "Health.tiers": "tier -> its status as the server gives it",
  "Jwks.keys": "each key as a JWK object (kty, kid and the rest)",
  "Introspection.active": "a property; the token's other claims are open-ended",
  "StartedFromSnapshot.errors": "each error body ({code, message, fix, rule})",
  "SandboxRequest.volumes": "a mount, or its short form \"name:/work/path[:ro]\"",
  "RunRequest.stdin": "text or bytes (bytes go as stdin_base64)",
  "ExecBody.stdin": "text or bytes (bytes go as stdin_base64)",
  "RunRequest.code": "the command (a string)",
  "RunRequest.argv": "the command (an array)",
  "RunRequest.stdin_base64": "stdin given as bytes",
  "RunRequest.stream": "runStream",
  "RunRequest.files": "path -> contents",
  "RunRequest.args": "not taken: an argv carries its own arguments",
  "RunRequest.wasm_base64": "not taken: the SDK runs code and programs, not modules",
  "ExecBody.code": "the command (a string)",
  "ExecBody.argv": "the command (an array)",
  "ExecBody.stdin_base64": "stdin given as bytes",
  "ExecBody.stream": "execStream",
  "ExecBody.background": "execBackground",
  "ExecBody.pty": "execBackground's pty",
  "ExecBody.args": "not taken: an argv carries its own arguments",
  "ExecBody.wasm_base64": "not taken: the SDK runs code and programs, not modules",
  "StartFromSnapshotRequest.count": "startFromSnapshot's count",
};
for (const p of Object.keys(SCHEMAS.Introspection.properties)) {
  OTHERWISE[`Introspection.${p}`] ??= "a claim (TokenInfo is open-ended)";
}

// Words where the SDK's union differs from the spec's enum on purpose: "Schema.property" ->
// ["wider" | "narrower", why].
const WORDS = {
  "RunRequest.lang": ["wider", "the server's parser also takes py and js"],
  "ExecBody.lang": ["wider", "the server's parser also takes py and js"],
  "SandboxInfo.on_timeout": ["narrower", "sent only when not destroy"],
};

// Properties a type has that its schema does not: "Type.property" -> why.
const SDK_ONLY = {
  "FileEntry.path": "set by stat (the Stat schema)",
  "ExecOptions.signal": "aborts the call (the client's own)",
  "RunOptions.signal": "aborts the call (the client's own)",
};

// Schemas the SDK has no type of its own for, and why.
const NOT_MODELLED = {
  AuditEvents: "answered as AuditEvent[]",
  ContextList: "answered as Context handles",
  ExecList: "answered as BackgroundExec handles",
  SnapshotList: "answered as Snapshot[]",
  SnapshotDeleted: "deleteSnapshot answers nothing",
  MetricsList: "answered as MetricSample[] (Sandbox.metrics)",
  CellError: "CellResult.error, inline",
  CellLogs: "CellResult.logs, inline",
  CellOutput: "CellResult.results, inline",
  Skipped: "ArchiveReport.skipped, inline",
  PoolHealth: "Health.pools, inline",
  VolumeMountInfo: "Volume.mounts, inline",
  Jwk: "Jwks.keys, open-ended",
  Error: "ErrorBody (the error test below)",
  Snapshot: "the dashboard's stream (/dashboard), not the SDK's",
  LiveCount: "the dashboard's",
  LiveSandbox: "the dashboard's",
  PoolFill: "the dashboard's",
};
// The request bodies of routes whose few fields the client's methods name as parameters.
const SMALL_REQUESTS = [
  "CellBody", "ContextBody", "IntrospectForm", "MkdirBody", "PatchRequest",
  "PauseRequest", "RenameBody", "ResizeBody", "RunFile", "SnapshotRequest", "StdinBody",
  "VolumeCreate",
];

const program = ts.createProgram([join(PKG, "src/models.ts"), join(PKG, "src/errors.ts")], {
  strict: true, target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext, lib: ["lib.es2022.d.ts", "lib.dom.d.ts"],
  types: [], noEmit: true,
});
const checker = program.getTypeChecker();

function exportsOf(file) {
  const sf = program.getSourceFile(join(PKG, "src", file));
  return new Map(checker.getExportsOfModule(checker.getSymbolAtLocation(sf)).map((s) => [s.name, s]));
}
const TYPES = exportsOf("models.ts");

function typeNamed(name) {
  const sym = TYPES.get(name);
  assert.ok(sym, `src/models.ts exports no ${name}`);
  return checker.getDeclaredTypeOfSymbol(sym);
}

/** A property's schema without its null, and whether it may be null. */
function resolveProp(prop) {
  if (prop === true || prop === false || !prop) return [prop, false];
  if (prop.anyOf) {
    const rest = prop.anyOf.filter((p) => p.type !== "null" || Object.keys(p).length > 1);
    if (rest.length === 1 && rest.length < prop.anyOf.length) return [{ ...prop, ...rest[0], anyOf: undefined }, true];
  }
  if (Array.isArray(prop.type) && prop.type.includes("null")) {
    const left = prop.type.filter((t) => t !== "null");
    return [{ ...prop, type: left.length === 1 ? left[0] : left }, true];
  }
  return [prop, false];
}
const refName = (p) => p?.$ref?.split("/").pop();

/** The words a schema allows (an enum or constants), or null for any string. */
function words(s) {
  if (s.enum) return s.enum;
  const alts = s.oneOf ?? s.anyOf;
  if (!alts) return s.type === "string" ? null : undefined;
  const out = [];
  let any = false;
  for (const a of alts) {
    if ("const" in a) out.push(a.const);
    else if (a.enum) out.push(...a.enum);
    else if (a.type === "string") any = true;
    else return undefined;
  }
  return any ? null : out;
}

const parts = (t) => (t.isUnion() ? t.types : [t]);
const F = ts.TypeFlags;
const nonNull = (t) => parts(t).filter((p) => !(p.flags & (F.Null | F.Undefined)));
const hasNull = (t) => parts(t).some((p) => p.flags & F.Null);
const show = (t) => checker.typeToString(t);

/** Why type `t` is not `prop`'s type (a list, empty when it is). */
function typeErrors(t, prop, where, key) {
  [prop] = resolveProp(prop);
  const ps = nonNull(t);
  if (prop === true || !prop || Object.keys(prop).length === 0) return [];
  const name = refName(prop);
  if (name) {
    const s = SCHEMAS[name];
    if (!s.properties) {
      const w = words(s);
      if (w === undefined && s.anyOf) return scalarUnion(ps, s.anyOf, where);
      return wordErrors(ps, w, `${where} (${name})`, key);
    }
    return objectErrors(ps, name, where);
  }
  if (prop.enum) return wordErrors(ps, prop.enum, where, key);
  if (prop.anyOf) return scalarUnion(ps, prop.anyOf, where);
  switch (prop.type) {
    case "integer":
    case "number":
      return ps.every((p) => p.flags & (F.Number | F.NumberLiteral)) ? [] : [`${where}: ${show(t)} (want number)`];
    case "string":
      return ps.every((p) => p.flags & (F.String | F.StringLiteral)) ? [] : [`${where}: ${show(t)} (want string)`];
    case "boolean":
      return ps.every((p) => p.flags & (F.Boolean | F.BooleanLiteral)) ? [] : [`${where}: ${show(t)} (want boolean)`];
    case "array": {
      const arr = ps.find((p) => checker.isArrayType(p) || checker.isTupleType(p));
      if (!arr || ps.length !== 1) return [`${where}: ${show(t)} (want an array)`];
      return typeErrors(checker.getTypeArguments(arr)[0], prop.items ?? {}, `${where}[]`);
    }
    case "object": {
      const value = ps.length === 1 ? ps[0].getStringIndexType() : undefined;
      if (!value) return [`${where}: ${show(t)} (want Record<string, …>)`];
      return typeErrors(value, prop.additionalProperties ?? {}, `${where}{}`);
    }
    default:
      return [`${where}: the spec's ${JSON.stringify(prop)} is not a type this test knows`];
  }
}

function scalarUnion(ps, alts, where) {
  const want = alts.map((a) => (a.type === "integer" ? "number" : a.type));
  const have = new Set(ps.map((p) => (p.flags & (F.Number | F.NumberLiteral) ? "number" : p.flags & (F.String | F.StringLiteral) ? "string" : "other")));
  return want.every((w) => have.has(w)) && !have.has("other") ? [] : [`${where}: ${[...have].join(" | ")} (want ${want.join(" | ")})`];
}

function wordErrors(ps, allowed, where, key) {
  if (ps.length === 1 && ps[0].flags & F.String) return [];
  if (!ps.every((p) => p.flags & F.StringLiteral)) return [`${where}: ${ps.map(show).join(" | ")} (want string or its words)`];
  const have = ps.map((p) => p.value).sort();
  if (allowed === null) return [];
  const want = [...allowed].sort();
  const [how] = WORDS[key] ?? [];
  const ok = how === "wider" ? want.every((w) => have.includes(w))
    : how === "narrower" ? have.every((w) => want.includes(w))
    : JSON.stringify(have) === JSON.stringify(want);
  return ok ? [] : [`${where}: words ${have.join(", ")}; the spec's are ${want.join(", ")}`];
}

function objectErrors(ps, schemaName, where) {
  if (ps.length !== 1 || !(ps[0].flags & F.Object)) return [`${where}: ${ps.map(show).join(" | ")} (want ${schemaName})`];
  const t = ps[0];
  const named = t.aliasSymbol?.name ?? (t.symbol?.name !== "__type" && t.symbol?.name !== "__object" ? t.symbol?.name : undefined);
  if (named) {
    return named === MODELS[schemaName] ? [] : [`${where}: ${named} for ${schemaName} (want ${MODELS[schemaName] ?? "a type in MODELS"})`];
  }
  // An inline object type: held to the schema itself.
  return modelErrors(schemaName, t, where);
}

/** Why type `t` does not model schema `schemaName`. */
function modelErrors(schemaName, t, label = schemaName) {
  const schema = SCHEMAS[schemaName];
  const required = new Set(schema.required ?? []);
  const props = new Map(checker.getPropertiesOfType(t).map((p) => [p.name, p]));
  const typeName = MODELS[schemaName] ?? label;
  const out = [];
  for (const [name, prop] of Object.entries(schema.properties ?? {})) {
    const where = `${label}.${name}`;
    if (OTHERWISE[`${schemaName}.${name}`]) continue;
    const sym = props.get(name);
    if (!sym) {
      out.push(`${where}: the SDK's ${typeName} has no such property`);
      continue;
    }
    const pt = checker.getTypeOfSymbol(sym);
    out.push(...typeErrors(pt, prop, where, `${schemaName}.${name}`));
    const optional = (sym.flags & ts.SymbolFlags.Optional) !== 0;
    const [, nullable] = resolveProp(prop);
    if (nullable && !optional && !hasNull(pt)) out.push(`${where}: the spec allows null; the SDK's type has no null and is not optional`);
    if (!required.has(name) && !nullable && !("default" in prop) && !optional) {
      out.push(`${where}: the spec may leave it out; the SDK's property is not optional`);
    }
  }
  for (const name of props.keys()) {
    if (!(name in (schema.properties ?? {})) && !SDK_ONLY[`${typeName}.${name}`]) {
      const others = Object.entries(MODELS).filter(([s, n]) => n === typeName && s !== schemaName);
      if (!others.some(([s]) => name in (SCHEMAS[s].properties ?? {}))) {
        out.push(`${typeName}.${name}: not a property of ${schemaName}`);
      }
    }
  }
  return out;
}

test("every schema of the spec is modelled, or said why not", () => {
  const known = new Set([...Object.keys(MODELS), ...Object.keys(NOT_MODELLED), ...SMALL_REQUESTS]);
  const objects = Object.keys(SCHEMAS).filter((n) => SCHEMAS[n].properties);
  assert.deepEqual(objects.filter((n) => !known.has(n)), [],
    "schemas of docs/openapi.json the TypeScript SDK neither models nor names in NOT_MODELLED");
  assert.deepEqual([...known].filter((n) => !SCHEMAS[n]), [], "schemas named here that the spec no longer has");
});

for (const [schemaName, typeName] of Object.entries(MODELS)) {
  test(`${typeName} has every property of ${schemaName}`, () => {
    assert.deepEqual(modelErrors(schemaName, typeNamed(typeName)), []);
  });
}

test("the words of the SDK's named unions are the spec's", () => {
  for (const [alias, schema] of [["Tier", "Tier"], ["Termination", "Termination"], ["FileKind", "FileKind"]]) {
    assert.deepEqual(wordErrors(nonNull(typeNamed(alias)), words(SCHEMAS[schema]), alias), []);
  }
});

test("every error code of the spec has its class, and ErrorBody is the spec's Error", () => {
  const errors = exportsOf("errors.ts");
  const byCode = errors.get("BY_CODE");
  // Its keys as written (its type is a Record of any string).
  let init = byCode.valueDeclaration.initializer;
  while (!init.properties) init = init.expression;
  const codes = init.properties.map((p) => p.name.text).sort();
  const spec = [...SCHEMAS.Code.enum].sort();
  assert.deepEqual(spec.filter((c) => !codes.includes(c)), [], "codes of the spec the SDK has no class for");
  assert.deepEqual(codes.filter((c) => !spec.includes(c)), [], "classes of codes the spec no longer has");
  const body = checker.getDeclaredTypeOfSymbol(errors.get("ErrorBody"));
  assert.deepEqual(modelErrors("Error", body, "ErrorBody"), []);
});

test("a property the spec gains fails here", () => {
  SCHEMAS.__Probe = { ...SCHEMAS.FileWritten, properties: { ...SCHEMAS.FileWritten.properties, sha256: { type: "string" } } };
  try {
    assert.deepEqual(modelErrors("__Probe", typeNamed("FileWritten")), [
      "__Probe.sha256: the SDK's __Probe has no such property",
    ]);
  } finally {
    delete SCHEMAS.__Probe;
  }
});
