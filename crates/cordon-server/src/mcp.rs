//! MCP (rmcp): tools to run code, create a sandbox, exec, write and read files, list, stat,
//! remove, rename and make directories, destroy.
//! Served over stdio (`cordon mcp`, one local tenant) and streamable HTTP at `/mcp`
//! (the API key's tenant, set by the auth middleware).

use std::sync::Arc;

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};

use cordon_core::{FileOp, FileReply};

use crate::ServerError;
use crate::keys::Tenant;
use crate::model::{CreateRequest, ExecBody, RunRequest};
use crate::service::Service;

/// The MCP server: every tool acts for one tenant.
#[derive(Clone)]
pub struct CordonMcp {
    svc: Service,
    /// The tenant over stdio; over HTTP it comes from the request.
    fixed: Option<Tenant>,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunArgs {
    /// The source code to run.
    pub code: String,
    /// python, bash, sh or javascript (default python).
    #[serde(default)]
    pub lang: Option<String>,
    /// runtime, wasm, container, gvisor or microvm (default: the server's), or auto (the
    /// policy picks from trust and autonomy).
    #[serde(default)]
    pub tier: Option<String>,
    /// Where the code's input came from: trusted or untrusted (give with autonomy to let
    /// the tier policy pick or check the tier).
    #[serde(default)]
    pub trust: Option<String>,
    /// What the code may do: compute, read-files, write-files, install-packages, internet.
    #[serde(default)]
    pub autonomy: Option<String>,
    /// Timeout such as "10s".
    #[serde(default)]
    pub timeout: Option<String>,
    /// Standard input as text.
    #[serde(default)]
    pub stdin: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CreateArgs {
    #[serde(default)]
    pub tier: Option<String>,
    /// trusted or untrusted (with autonomy: the tier policy picks or checks the tier).
    #[serde(default)]
    pub trust: Option<String>,
    /// compute, read-files, write-files, install-packages or internet.
    #[serde(default)]
    pub autonomy: Option<String>,
    /// Lifetime such as "10m".
    #[serde(default)]
    pub ttl: Option<String>,
    /// Destroyed after this long unused, such as "5m".
    #[serde(default)]
    pub idle_timeout: Option<String>,
    /// Hosts the sandbox may reach; none by default.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Grants of the server's catalogue, by name.
    #[serde(default)]
    pub grants: Vec<String>,
    /// A template (an image's read-only root filesystem) the sandbox's root is made from.
    #[serde(default)]
    pub template: Option<String>,
    /// Labels to find it by later (list_sandboxes filters on them).
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Volumes of yours to mount (create_volume makes them): name, a path under /work,
    /// read_only (many sandboxes may; read-write is one sandbox's alone).
    #[serde(default)]
    pub volumes: Vec<VolumeMountArgs>,
}

#[derive(Debug, Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct VolumeMountArgs {
    pub name: String,
    /// Its mount point, an absolute path under /work such as /work/data.
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct VolumeArgs {
    /// 1 to 63 of a-z, 0-9, '_' and '-'.
    pub name: String,
    /// Its size, which is its quota, such as "256M" (at least 8M).
    pub size: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct VolumeNameArgs {
    pub name: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecArgs {
    /// The sandbox id from create_sandbox.
    pub sandbox: String,
    /// Source code (with lang), or leave out and give argv.
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub lang: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub stdin: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteFileArgs {
    pub sandbox: String,
    /// A path under /work.
    pub path: String,
    pub content: String,
    /// True when content is base64 (binary files).
    #[serde(default)]
    pub base64: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct FileArgs {
    pub sandbox: String,
    /// A path under /work.
    pub path: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ListArgs {
    pub sandbox: String,
    /// A directory: /work (the default) or beneath it.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RemoveArgs {
    pub sandbox: String,
    /// A path under /work (not /work itself).
    pub path: String,
    /// Remove a directory that is not empty, and everything beneath it.
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RenameArgs {
    pub sandbox: String,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct MkdirArgs {
    pub sandbox: String,
    pub path: String,
    /// Make missing parents too; an existing directory is not an error.
    #[serde(default)]
    pub parents: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SandboxArgs {
    pub sandbox: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PauseArgs {
    pub sandbox: String,
    /// Save the whole sandbox to disk and free its memory (microvm only); it survives a
    /// server restart.
    #[serde(default)]
    pub to_disk: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct StartArgs {
    /// The sandbox id from create_sandbox.
    pub sandbox: String,
    /// Source code (with lang), or leave out and give argv.
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub lang: Option<String>,
    /// A program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Run it on a pseudo-terminal of this size (an interactive program: a REPL, an editor,
    /// a TUI); its output is all stdout. resize_exec changes the size.
    #[serde(default)]
    pub pty: Option<PtyArgs>,
}

/// A terminal size in character cells, each 1 to 1000.
#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct PtyArgs {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ResizeArgs {
    pub sandbox: String,
    /// The background exec's id (ex-<n>), started with pty.
    pub exec: String,
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecIdArgs {
    pub sandbox: String,
    /// The background exec's id (ex-<n>) from start_background or list_execs.
    pub exec: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct KillArgs {
    pub sandbox: String,
    pub exec: String,
    /// SIGKILL at once instead of SIGTERM then SIGKILL after the server's grace.
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunCodeArgs {
    /// The sandbox id from create_sandbox.
    pub sandbox: String,
    /// One cell of code; the value of its last expression comes back as `text`.
    pub code: String,
    /// A context id (ctx-<n>) from create_context; left out: the sandbox's default context
    /// of `lang`, made at its first use.
    #[serde(default)]
    pub context: Option<String>,
    /// python (default) or javascript; only without `context`.
    #[serde(default)]
    pub lang: Option<String>,
    /// The cell's timeout such as "30s"; past it the cell is interrupted and the context
    /// keeps its state.
    #[serde(default)]
    pub timeout: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ContextArgs {
    pub sandbox: String,
    /// python or javascript.
    pub lang: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ContextIdArgs {
    pub sandbox: String,
    /// The context's id (ctx-<n>) from create_context or list_contexts.
    pub context: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct UpdateArgs {
    pub sandbox: String,
    /// A new lifetime from its creation, such as "30m" (paused time is not counted).
    #[serde(default)]
    pub ttl: Option<String>,
    /// A new idle timeout such as "10m".
    #[serde(default)]
    pub idle_timeout: Option<String>,
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| format!("invalid_request: {e}"))
}

fn drop_nulls(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.retain(|_, x| !x.is_null());
    }
    v
}

impl CordonMcp {
    /// One file operation; the answer as the HTTP API gives it.
    async fn file_op(
        &self,
        ctx: &RequestContext<RoleServer>,
        sandbox: &str,
        op: FileOp,
    ) -> Result<String, String> {
        let t = self.tenant(ctx)?;
        let reply = self
            .svc
            .file_op(&t, sandbox, op.clone())
            .await
            .map_err(|e| e.to_string())?;
        match reply {
            FileReply::Entries { entries, truncated } => text(&crate::api_files::Listing {
                path: op.path().to_string(),
                entries,
                truncated,
            }),
            FileReply::Entry { entry } => text(&crate::api_files::Stat {
                path: op.path().to_string(),
                entry,
            }),
            FileReply::Done => text(&json!({"op": op.name(), "path": op.path()})),
        }
    }
}

fn text(v: &impl serde::Serialize) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| format!("internal: {e}"))
}

/// A service call's answer as a tool's: the JSON of its value, or its error's text.
fn reply<T: serde::Serialize>(r: Result<T, crate::error::ApiError>) -> Result<String, String> {
    text(&r.map_err(|e| e.to_string())?)
}

#[tool_router]
impl CordonMcp {
    pub fn new(svc: Service, fixed: Option<Tenant>) -> Self {
        CordonMcp {
            svc,
            fixed,
            tool_router: Self::tool_router(),
        }
    }

    fn tenant(&self, ctx: &RequestContext<RoleServer>) -> Result<Tenant, String> {
        if let Some(t) = &self.fixed {
            return Ok(t.clone());
        }
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Tenant>().cloned())
            .ok_or_else(|| "unauthorized: no API key on this MCP session".to_string())
    }

    #[tool(
        description = "Run code once in a fresh sandbox (created, run, destroyed). Returns the outcome: termination, exit_code, stdout, stderr, usage."
    )]
    async fn run(
        &self,
        Parameters(a): Parameters<RunArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let req: RunRequest = parse(drop_nulls(json!({
            "code": a.code,
            "lang": a.lang.unwrap_or_else(|| "python".into()),
            "tier": a.tier,
            "trust": a.trust,
            "autonomy": a.autonomy,
            "timeout": a.timeout,
            "stdin": a.stdin,
        })))?;
        let (create, exec, files) = req.split();
        let job = self
            .svc
            .begin_run(&t, create, &exec, files)
            .await
            .map_err(|e| e.to_string())?;
        text(&job.run(None).await.map_err(|e| e.to_string())?)
    }

    #[tool(
        description = "Create a sandbox that lives across calls (until destroy, its ttl or idle timeout). Returns its id."
    )]
    async fn create_sandbox(
        &self,
        Parameters(a): Parameters<CreateArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let req: CreateRequest = parse(drop_nulls(json!({
            "tier": a.tier,
            "trust": a.trust,
            "autonomy": a.autonomy,
            "ttl": a.ttl,
            "idle_timeout": a.idle_timeout,
            "allow_hosts": a.allow_hosts,
            "grants": a.grants,
            "template": a.template,
            "labels": a.labels,
            "volumes": a.volumes,
        })))?;
        text(&self.svc.create(&t, req).await.map_err(|e| e.to_string())?)
    }

    #[tool(
        description = "Create a volume: a named file system of the given size (its quota) that outlives sandboxes; mount it with create_sandbox's volumes."
    )]
    async fn create_volume(
        &self,
        Parameters(a): Parameters<VolumeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let req = parse(json!({"name": a.name, "size": a.size}))?;
        reply(self.svc.create_volume(&t, req).await)
    }

    #[tool(
        description = "List your volumes (size, bytes used, the sandboxes mounting each) and your volume quota."
    )]
    async fn list_volumes(&self, ctx: RequestContext<RoleServer>) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        text(&self.svc.volumes(&t).await.map_err(|e| e.to_string())?)
    }

    #[tool(description = "Delete a volume and its contents (refused while a sandbox mounts it).")]
    async fn delete_volume(
        &self,
        Parameters(a): Parameters<VolumeNameArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.delete_volume(&t, &a.name).await)
    }

    #[tool(description = "Run code (lang + code) or a program (argv) in an existing sandbox.")]
    async fn exec(
        &self,
        Parameters(a): Parameters<ExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let lang = match (&a.code, &a.lang) {
            (Some(_), None) => Some("python".to_string()),
            (_, l) => l.clone(),
        };
        let body: ExecBody = parse(drop_nulls(json!({
            "code": a.code,
            "lang": lang,
            "argv": a.argv,
            "timeout": a.timeout,
            "stdin": a.stdin,
        })))?;
        let job = self
            .svc
            .begin_exec(&t, &a.sandbox, &body)
            .map_err(|e| e.to_string())?;
        text(&job.run(None).await.map_err(|e| e.to_string())?)
    }

    #[tool(description = "Write a file under /work in a sandbox.")]
    async fn write_file(
        &self,
        Parameters(a): Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let data = if a.base64 {
            base64::engine::general_purpose::STANDARD
                .decode(&a.content)
                .map_err(|e| format!("invalid_request: content is not base64: {e}"))?
        } else {
            a.content.into_bytes()
        };
        reply(
            self.svc
                .put_file(&t, &a.sandbox, &a.path, data, 0o644)
                .await,
        )
    }

    #[tool(
        description = "Read a file under /work in a sandbox. Returns {path, text} or {path, base64} for binary content."
    )]
    async fn read_file(
        &self,
        Parameters(a): Parameters<FileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let data = self
            .svc
            .get_file(&t, &a.sandbox, &a.path)
            .await
            .map_err(|e| e.to_string())?;
        let v = match String::from_utf8(data) {
            Ok(s) => json!({"path": a.path, "text": s}),
            Err(e) => json!({"path": a.path,
                "base64": base64::engine::general_purpose::STANDARD.encode(e.into_bytes())}),
        };
        text(&v)
    }

    #[tool(
        description = "List a directory under /work in a sandbox: {path, entries: [{name, kind, size, mode, mtime_ms}], truncated}. Symlinks are listed as symlinks, never followed."
    )]
    async fn list_files(
        &self,
        Parameters(a): Parameters<ListArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let path = a.path.unwrap_or_else(|| cordon_core::WORKDIR.to_string());
        self.file_op(&ctx, &a.sandbox, FileOp::List { path }).await
    }

    #[tool(
        description = "Stat a path under /work in a sandbox: {name, kind, size, mode, mtime_ms}; a symlink is reported as one, not followed."
    )]
    async fn stat_file(
        &self,
        Parameters(a): Parameters<FileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let op = FileOp::Stat { path: a.path };
        self.file_op(&ctx, &a.sandbox, op).await
    }

    #[tool(
        description = "Remove a file, symlink or empty directory under /work in a sandbox; recursive removes a directory and everything beneath it."
    )]
    async fn remove_path(
        &self,
        Parameters(a): Parameters<RemoveArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let op = FileOp::Remove {
            path: a.path,
            recursive: a.recursive,
        };
        self.file_op(&ctx, &a.sandbox, op).await
    }

    #[tool(description = "Rename or move a path under /work in a sandbox.")]
    async fn rename_path(
        &self,
        Parameters(a): Parameters<RenameArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let op = FileOp::Rename {
            from: a.from,
            to: a.to,
        };
        self.file_op(&ctx, &a.sandbox, op).await
    }

    #[tool(
        description = "Make a directory under /work in a sandbox (parents: also missing parents)."
    )]
    async fn make_dir(
        &self,
        Parameters(a): Parameters<MkdirArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let op = FileOp::Mkdir {
            path: a.path,
            parents: a.parents,
        };
        self.file_op(&ctx, &a.sandbox, op).await
    }

    #[tool(
        description = "Start code (lang + code) or a program (argv) in the background in a sandbox (a dev server, a watcher). Returns its exec id at once; read_exec shows its output, kill_exec stops it."
    )]
    async fn start_background(
        &self,
        Parameters(a): Parameters<StartArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let lang = match (&a.code, &a.lang) {
            (Some(_), None) => Some("python".to_string()),
            (_, l) => l.clone(),
        };
        let body: ExecBody = parse(drop_nulls(json!({
            "code": a.code,
            "lang": lang,
            "argv": a.argv,
            "background": true,
            "pty": a.pty,
        })))?;
        reply(self.svc.start_background(&t, &a.sandbox, &body).await)
    }

    #[tool(
        description = "Run a cell of Python (or JavaScript) in a sandbox's long-lived interpreter: variables, imports and open files persist from one call to the next. Returns status (ok, error, timeout, died), text (the last expression's value), results (MIME bundles: image/png base64 from matplotlib or _repr_png_, text/html, application/json), logs (stdout, stderr) and error (name, value, traceback)."
    )]
    async fn run_code(
        &self,
        Parameters(a): Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let cid = match a.context {
            Some(c) => c,
            None => {
                let body: crate::model::ContextBody = parse(json!({
                    "lang": a.lang.unwrap_or_else(|| "python".into()),
                    "default": true,
                }))?;
                self.svc
                    .create_context(&t, &a.sandbox, &body)
                    .await
                    .map_err(|e| e.to_string())?
                    .id
            }
        };
        let body: crate::model::CellBody =
            parse(drop_nulls(json!({"code": a.code, "timeout": a.timeout})))?;
        reply(self.svc.run_cell(&t, &a.sandbox, &cid, body, None).await)
    }

    #[tool(
        description = "Start a code context (python or javascript) in a sandbox: a long-lived interpreter for run_code. Returns its id (ctx-<n>)."
    )]
    async fn create_context(
        &self,
        Parameters(a): Parameters<ContextArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let body: crate::model::ContextBody = parse(json!({"lang": a.lang}))?;
        reply(self.svc.create_context(&t, &a.sandbox, &body).await)
    }

    #[tool(
        description = "List a sandbox's code contexts: id, lang, state (ready, running, dead), execution_count."
    )]
    async fn list_contexts(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let v = self
            .svc
            .list_contexts(&t, &a.sandbox)
            .map_err(|e| e.to_string())?;
        text(&json!({ "contexts": v }))
    }

    #[tool(
        description = "Restart a code context's interpreter: every variable and import is gone."
    )]
    async fn restart_context(
        &self,
        Parameters(a): Parameters<ContextIdArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.restart_context(&t, &a.sandbox, &a.context).await)
    }

    #[tool(description = "End a code context (its interpreter is killed).")]
    async fn delete_context(
        &self,
        Parameters(a): Parameters<ContextIdArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.delete_context(&t, &a.sandbox, &a.context).await)
    }

    #[tool(
        description = "List a sandbox's background execs: id, command, state (running or exited), started_ms, exit_code."
    )]
    async fn list_execs(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let v = self
            .svc
            .list_execs(&t, &a.sandbox)
            .await
            .map_err(|e| e.to_string())?;
        text(&json!({ "execs": v }))
    }

    #[tool(
        description = "Read a background exec's output so far (the last 1 MiB of each stream) and its state, without waiting."
    )]
    async fn read_exec(
        &self,
        Parameters(a): Parameters<ExecIdArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.peek_exec(&t, &a.sandbox, &a.exec).await)
    }

    #[tool(
        description = "Resize a background exec's pseudo-terminal (one started with pty): its program gets SIGWINCH and sees the new rows and cols."
    )]
    async fn resize_exec(
        &self,
        Parameters(a): Parameters<ResizeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let size = cordon_core::PtySize {
            rows: a.rows,
            cols: a.cols,
        };
        reply(self.svc.exec_resize(&t, &a.sandbox, &a.exec, size).await)
    }

    #[tool(
        description = "Stop a background exec: SIGTERM to its process tree, SIGKILL after a grace (force: at once)."
    )]
    async fn kill_exec(
        &self,
        Parameters(a): Parameters<KillArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.exec_signal(&t, &a.sandbox, &a.exec, a.force).await)
    }

    #[tool(
        description = "Pause a sandbox: its processes stop (no CPU), its memory stays, its TTL clock stands still; execs are refused until resume_sandbox. to_disk (microvm only) saves it to disk and frees its memory; it survives a server restart."
    )]
    async fn pause_sandbox(
        &self,
        Parameters(a): Parameters<PauseArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.pause(&t, &a.sandbox, a.to_disk).await)
    }

    #[tool(description = "Resume a paused sandbox; its processes continue where they stopped.")]
    async fn resume_sandbox(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.resume(&t, &a.sandbox).await)
    }

    #[tool(
        description = "Change a sandbox's ttl (from its creation) or idle_timeout, within the server's maxima."
    )]
    async fn update_sandbox(
        &self,
        Parameters(a): Parameters<UpdateArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        let req: crate::model::PatchRequest = parse(drop_nulls(json!({
            "ttl": a.ttl,
            "idle_timeout": a.idle_timeout,
        })))?;
        reply(self.svc.patch(&t, &a.sandbox, req).await)
    }

    #[tool(description = "Destroy a sandbox (idempotent).")]
    async fn destroy(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, String> {
        let t = self.tenant(&ctx)?;
        reply(self.svc.destroy(&t, &a.sandbox).await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CordonMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cordon", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Cordon runs code in isolated sandboxes. Use `run` for one-off code; \
                 create_sandbox + exec/write_file/read_file + destroy for multi-step work. \
                 Sandboxes have no network unless created with allow_hosts.",
            )
    }
}

/// Which tenant opened each MCP session over HTTP (the auth middleware keeps it). A
/// session rmcp has closed (deleted, or idle past its keep-alive) leaves the book the next
/// time a tenant's sessions are counted.
pub struct SessionBook {
    manager: Arc<LocalSessionManager>,
    owners: std::sync::Mutex<std::collections::HashMap<String, Tenant>>,
}

impl SessionBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Tenant>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True if `tenant` opened the session `id`.
    pub fn owned_by(&self, id: &str, tenant: &Tenant) -> bool {
        self.lock().get(id).is_some_and(|t| t == tenant)
    }

    pub fn bind(&self, id: &str, tenant: &Tenant) {
        self.lock().insert(id.to_string(), tenant.clone());
    }

    pub fn unbind(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Sessions `tenant` holds now (closed ones forgotten first).
    pub async fn count(&self, tenant: &Tenant) -> usize {
        let live: std::collections::HashSet<String> = self
            .manager
            .sessions
            .read()
            .await
            .keys()
            .map(|k| k.to_string())
            .collect();
        let mut owners = self.lock();
        owners.retain(|id, _| live.contains(id));
        owners.values().filter(|t| *t == tenant).count()
    }
}

/// MCP over streamable HTTP, to be mounted at `/mcp` behind the API-key middleware, with
/// the book of which tenant holds which session.
pub fn http_service(
    svc: Service,
) -> (
    StreamableHttpService<CordonMcp, LocalSessionManager>,
    Arc<SessionBook>,
) {
    let bind = svc.config().bind;
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    hosts.push(bind.ip().to_string());
    hosts.push(bind.to_string());
    let cfg = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_cancellation_token(svc.cancelled().child_token());
    let manager = Arc::new(LocalSessionManager::default());
    let book = Arc::new(SessionBook {
        manager: manager.clone(),
        owners: Default::default(),
    });
    let service =
        StreamableHttpService::new(move || Ok(CordonMcp::new(svc.clone(), None)), manager, cfg);
    (service, book)
}

/// Serves MCP over any byte stream pair for one tenant (stdio for `cordon mcp`).
pub async fn serve_io<R, W>(svc: Service, tenant: Tenant, io: (R, W)) -> Result<(), ServerError>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let running = CordonMcp::new(svc, Some(tenant))
        .serve(io)
        .await
        .map_err(|e| {
            ServerError::io(
                "starting the MCP session",
                std::io::Error::other(e.to_string()),
            )
        })?;
    running
        .waiting()
        .await
        .map_err(|e| ServerError::io("MCP session", std::io::Error::other(e.to_string())))?;
    Ok(())
}
