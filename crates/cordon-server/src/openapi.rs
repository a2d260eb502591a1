//! The OpenAPI document, generated: every route is added to the router through [`Api`],
//! which records its operation (id, tag, summary, parameters, body, answers and the error
//! codes it may give) beside the handler, and the schemas are the JSON Schemas (schemars)
//! of the very types the handlers take and answer, the ones MCP's tools take and answer
//! too. `docs/openapi.json` is this document; a test fails when they differ
//! (`CORDON_UPDATE_OPENAPI=1 cargo test -p cordon-server --test api openapi` writes it).
//!
//! schemars rather than utoipa: rmcp already derives MCP's tool schemas with schemars, so one
//! derive on each wire type gives both; utoipa would need a second derive (`ToSchema`) on
//! every type in core, policy and the engine, and its own route macros beside axum's.

use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter, on};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::error::Code;
use crate::service::Service;

/// A schema of `T`, by reference into the document's components.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

pub fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// One answer of an operation.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub description: &'static str,
    /// Content type and its schema (none: a body that is not JSON, described in words).
    pub content: Vec<(&'static str, Option<SchemaFn>)>,
}

/// One operation: a method on a path, and what it takes and gives.
#[derive(Clone)]
pub struct Op {
    pub method: Method,
    pub path: &'static str,
    pub id: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    /// Served without a key.
    pub public: bool,
    /// A type whose fields are the query parameters.
    pub query: Option<SchemaFn>,
    /// Query parameters described by hand: name, description, schema.
    pub query_params: Vec<(&'static str, &'static str, Value)>,
    pub body: Vec<(&'static str, Option<SchemaFn>)>,
    pub body_required: bool,
    pub answers: Vec<Answer>,
    pub errors: Vec<Code>,
}

impl Op {
    pub fn new(method: Method, path: &'static str, id: &'static str, tag: &'static str) -> Self {
        Op {
            method,
            path,
            id,
            tag,
            summary: "",
            public: false,
            query: None,
            query_params: Vec::new(),
            body: Vec::new(),
            body_required: true,
            answers: Vec::new(),
            errors: vec![Code::Unauthorized, Code::TooManyFailures, Code::Internal],
        }
    }

    pub fn get(path: &'static str, id: &'static str, tag: &'static str) -> Self {
        Op::new(Method::GET, path, id, tag)
    }

    pub fn post(path: &'static str, id: &'static str, tag: &'static str) -> Self {
        Op::new(Method::POST, path, id, tag)
    }

    pub fn put(path: &'static str, id: &'static str, tag: &'static str) -> Self {
        Op::new(Method::PUT, path, id, tag)
    }

    pub fn delete(path: &'static str, id: &'static str, tag: &'static str) -> Self {
        Op::new(Method::DELETE, path, id, tag)
    }

    pub fn patch(path: &'static str, id: &'static str, tag: &'static str) -> Self {
        Op::new(Method::PATCH, path, id, tag)
    }

    pub fn summary(mut self, s: &'static str) -> Self {
        self.summary = s;
        self
    }

    /// Served to anyone: no key, no key errors.
    pub fn public(mut self) -> Self {
        self.public = true;
        self.errors
            .retain(|c| !matches!(c, Code::Unauthorized | Code::TooManyFailures));
        self
    }

    pub fn query<T: JsonSchema>(mut self) -> Self {
        self.query = Some(schema_inline::<T>);
        self.errors.push(Code::InvalidRequest);
        self
    }

    pub fn query_param(mut self, name: &'static str, what: &'static str, s: Value) -> Self {
        self.query_params.push((name, what, s));
        self
    }

    /// A JSON body of type `T`.
    pub fn json<T: JsonSchema>(mut self) -> Self {
        self.body.push(("application/json", Some(schema::<T>)));
        self.errors.extend([
            Code::InvalidRequest,
            Code::PayloadTooLarge,
            Code::UnsupportedMediaType,
        ]);
        self
    }

    /// A body of another type (bytes, a tar stream, a form), or a second type of body.
    pub fn body(mut self, ctype: &'static str, s: Option<SchemaFn>) -> Self {
        self.body.push((ctype, s));
        self
    }

    pub fn body_optional(mut self) -> Self {
        self.body_required = false;
        self
    }

    /// A JSON answer of type `T`.
    pub fn ok<T: JsonSchema>(self, status: u16, description: &'static str) -> Self {
        self.answer(status, description, "application/json", Some(schema::<T>))
    }

    pub fn answer(
        mut self,
        status: u16,
        description: &'static str,
        ctype: &'static str,
        s: Option<SchemaFn>,
    ) -> Self {
        match self.answers.iter_mut().find(|a| a.status == status) {
            Some(a) => a.content.push((ctype, s)),
            None => self.answers.push(Answer {
                status,
                description,
                content: vec![(ctype, s)],
            }),
        }
        self
    }

    /// The error codes this operation may answer, beside the key's and `internal`.
    pub fn errors(mut self, codes: &[Code]) -> Self {
        self.errors.extend_from_slice(codes);
        self
    }

    fn filter(&self) -> MethodFilter {
        match self.method {
            Method::POST => MethodFilter::POST,
            Method::PUT => MethodFilter::PUT,
            Method::DELETE => MethodFilter::DELETE,
            Method::PATCH => MethodFilter::PATCH,
            _ => MethodFilter::GET,
        }
    }
}

/// A type's own schema (its properties inline), for query parameters.
fn schema_inline<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    T::json_schema(g)
}

/// The error codes of a sandbox named by its id.
pub const SANDBOX: &[Code] = &[
    Code::NotFound,
    Code::SandboxGone,
    Code::SandboxPaused,
    Code::ShuttingDown,
];

/// A router that records the operation of every route it is given.
#[derive(Default)]
pub struct Api {
    pub router: axum::Router<Service>,
    pub ops: Vec<Op>,
}

impl Api {
    /// Routes `op` to `handler`.
    pub fn op<H, T>(mut self, op: Op, handler: H) -> Self
    where
        H: Handler<T, Service>,
        T: 'static,
    {
        let mr: MethodRouter<Service> = on(op.filter(), handler);
        self.router = self.router.route(op.path, mr);
        self.ops.push(op);
        self
    }

    /// Adds another set of routes (with its own layers) and their operations.
    pub fn merge(mut self, other: Api) -> Self {
        self.router = self.router.merge(other.router);
        self.ops.extend(other.ops);
        self
    }

    /// Applies a layer to the routes so far.
    pub fn map(mut self, f: impl FnOnce(axum::Router<Service>) -> axum::Router<Service>) -> Self {
        self.router = f(self.router);
        self
    }
}

fn path_param(name: &str) -> (&'static str, Value) {
    match name {
        "id" => (
            "The sandbox's id (`sb-` and 32 hex digits).",
            json!({"type": "string", "pattern": "^sb-[0-9a-f]{32}$"}),
        ),
        "exec_id" => (
            "A background exec's id (`ex-` and a number).",
            json!({"type": "string", "pattern": "^ex-[0-9]+$"}),
        ),
        "context_id" => (
            "A code context's id (`ctx-` and a number).",
            json!({"type": "string"}),
        ),
        "name" => ("The volume's name.", json!({"type": "string"})),
        "port" => (
            "A port a program of the sandbox listens on (1 to 65535; not the egress proxy's).",
            json!({"type": "integer", "minimum": 1, "maximum": 65535}),
        ),
        "rest" => (
            "The path the program is asked for, after the port.",
            json!({"type": "string"}),
        ),
        "path" => (
            "The file's sandbox path without its leading slash (`work/data.csv` names /work/data.csv).",
            json!({"type": "string"}),
        ),
        _ => ("", json!({"type": "string"})),
    }
}

fn content(g: &mut SchemaGenerator, c: &[(&'static str, Option<SchemaFn>)]) -> Value {
    let mut m = Map::new();
    for (ctype, s) in c {
        let schema = match s {
            Some(f) => f(g).to_value(),
            None if ctype.starts_with("application/json") => json!({"type": "object"}),
            None => json!({"type": "string"}),
        };
        m.insert((*ctype).to_string(), json!({ "schema": schema }));
    }
    Value::Object(m)
}

fn operation(g: &mut SchemaGenerator, op: &Op) -> Value {
    let mut params = Vec::new();
    for seg in op.path.split('/') {
        if let Some(name) = seg
            .strip_prefix('{')
            .and_then(|s| s.strip_suffix('}'))
            .map(|s| s.trim_start_matches('*'))
        {
            let (what, schema) = path_param(name);
            params.push(json!({"name": name, "in": "path", "required": true,
                "description": what, "schema": schema}));
        }
    }
    if let Some(q) = op.query {
        let s = q(g).to_value();
        let required: Vec<&str> = s["required"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(props) = s["properties"].as_object() {
            for (name, p) in props {
                let mut p = p.clone();
                let what = p
                    .as_object_mut()
                    .and_then(|o| o.remove("description"))
                    .unwrap_or(Value::Null);
                let mut param = json!({"name": name, "in": "query",
                    "required": required.contains(&name.as_str()), "schema": p});
                if !what.is_null() {
                    param["description"] = what;
                }
                params.push(param);
            }
        }
    }
    for (name, what, schema) in &op.query_params {
        params.push(json!({"name": name, "in": "query", "required": false,
            "description": what, "schema": schema}));
    }
    let mut o = json!({
        "operationId": op.id,
        "tags": [op.tag],
        "summary": op.summary,
    });
    if !params.is_empty() {
        o["parameters"] = Value::Array(params);
    }
    if !op.body.is_empty() {
        o["requestBody"] = json!({"required": op.body_required, "content": content(g, &op.body)});
    }
    let mut responses = Map::new();
    for a in &op.answers {
        responses.insert(
            a.status.to_string(),
            json!({"description": a.description, "content": content(g, &a.content)}),
        );
    }
    // The errors, by status, each naming its codes.
    let mut codes = op.errors.clone();
    codes.sort_by_key(|c| (c.status().as_u16(), c.as_str()));
    codes.dedup();
    let mut by_status: Vec<(u16, Vec<&str>)> = Vec::new();
    for c in codes {
        let s = c.status().as_u16();
        match by_status.last_mut() {
            Some((last, v)) if *last == s => v.push(c.as_str()),
            _ => by_status.push((s, vec![c.as_str()])),
        }
    }
    for (status, names) in by_status {
        responses.insert(
            status.to_string(),
            json!({
                "description": format!("An error: {}", names.join(", ")),
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }),
        );
    }
    o["responses"] = Value::Object(responses);
    if op.public {
        o["security"] = json!([]);
    }
    o
}

/// The OpenAPI 3.1 document of these operations.
pub fn document(ops: &[Op]) -> Value {
    let mut g = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    g.subschema_for::<crate::error::ApiError>();
    let mut paths: Map<String, Value> = Map::new();
    let mut sorted: Vec<&Op> = ops.iter().collect();
    sorted.sort_by_key(|o| (o.path, o.method.as_str().to_string()));
    for op in sorted {
        // A wildcard of the router (`{*path}`) is a plain parameter to OpenAPI.
        let item = paths
            .entry(op.path.replace("{*", "{"))
            .or_insert_with(|| json!({}));
        item[op.method.as_str().to_lowercase()] = operation(&mut g, op);
    }
    let schemas = g.take_definitions(true);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Cordon",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Run code an AI agent wrote in a sandbox. Every route but the public ones (health, the token issuer's documents, the dashboard's files) needs `Authorization: Bearer <api key>`; a tenant sees only its own sandboxes and audit rows (other ids are 404). Errors are {code, message, fix} with a stable code; each operation lists the codes it may answer. Unknown fields are refused. Generated from the server's router and wire types (crates/cordon-server/src/openapi.rs).",
        },
        "servers": [{"url": "http://127.0.0.1:7070"}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": "sandboxes", "description": "Create, list, pause, resume, change and destroy sandboxes."},
            {"name": "execs", "description": "Run code or programs in a sandbox: whole, streamed (NDJSON or SSE) or in the background."},
            {"name": "files", "description": "Files and directories under /work, one at a time or as tar streams."},
            {"name": "contexts", "description": "Long-lived Python and JavaScript interpreters whose state persists between cells."},
            {"name": "volumes", "description": "Named, size-limited file systems that outlive sandboxes."},
            {"name": "run", "description": "One call: create, exec once, destroy."},
            {"name": "audit", "description": "The tenant's audit rows."},
            {"name": "tokens", "description": "The issuer of the short-lived tokens minted grants carry."},
            {"name": "server", "description": "Health, metrics, MCP and the dashboard."},
        ],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
    })
}
