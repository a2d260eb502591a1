//! MCP (rmcp): the API's capabilities as tools. Each tool takes the API's own typed bodies
//! (or a sandbox id beside one), answers with the API's own typed answers as structured
//! content (its `outputSchema` is the answer type's JSON Schema) and as text, and carries a
//! title and the read-only, destructive and idempotent hints.
//! Served over stdio (`cordon mcp`, one local tenant) and streamable HTTP at `/mcp`
//! (the API key's tenant, set by the auth middleware).

use std::sync::Arc;

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ContentBlock, Implementation, IntoContents, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};

use cordon_core::{ExecOutcome, FileOp, Language, SandboxId};

use crate::ServerError;
use crate::audit::Query as AuditQuery;
use crate::error::{ApiError, Code};
use crate::keys::Tenant;
use crate::model::{
    AuditEvents, CellBody, CellResult, ContextBody, ContextInfo, ContextList, CreateRequest,
    Destroyed, Done, ExecBody, ExecInfo, ExecList, ExecPeek, FileWritten, Listing, PatchRequest,
    RunRequest, SandboxInfo, SandboxList, Stat, VolumeCreate, VolumeDeleted, VolumeInfo,
    VolumeList,
};
use crate::service::{PauseMode, Service};

mod args;
mod snapshots;

pub use args::{
    ContextArgs, ContextIdArgs, ContextLang, ExecArgs, ExecIdArgs, FileArgs, FileContent, KillArgs,
    ListArgs, ListSandboxesArgs, MkdirArgs, PauseArgs, RemoveArgs, RenameArgs, ResizeArgs,
    RunCodeArgs, SandboxArgs, StartArgs, UpdateArgs, VolumeNameArgs, WriteFileArgs,
};

/// The MCP server: every tool acts for one tenant.
#[derive(Clone)]
pub struct CordonMcp {
    svc: Service,
    /// The tenant over stdio; over HTTP it comes from the request.
    fixed: Option<Tenant>,
    tool_router: ToolRouter<Self>,
}

/// A tool's answer: the API's typed answer, or the API error. Each tool spells its type
/// out as `Result<Json<T>, ToolError>`: rmcp's macro reads the output schema from there (an
/// alias would hide it).
fn answer<T>(r: Result<T, ApiError>) -> Result<Json<T>, ToolError> {
    r.map(Json).map_err(ToolError)
}

/// A tool's error: the API error, which the agent reads as its text (`code: message (fix:
/// ...)`, in a tool result marked as an error); its source stays for the server's log.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(#[source] pub ApiError);

impl From<ApiError> for ToolError {
    fn from(e: ApiError) -> Self {
        ToolError(e)
    }
}

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        if let Some(cause) = &self.0.source {
            tracing::error!(
                code = self.0.code.as_str(),
                message = %self.0.message,
                cause = %crate::error::Chain(cause.as_ref()),
                "MCP tool failed"
            );
        }
        vec![ContentBlock::text(self.0.to_string())]
    }
}

/// Python when code comes without its language (the tools' documented default).
fn code_lang(code: &Option<String>, lang: Option<Language>) -> Option<Language> {
    match (code, lang) {
        (Some(_), None) => Some(Language::Python),
        (_, l) => l,
    }
}

#[tool_router]
impl CordonMcp {
    pub fn new(svc: Service, fixed: Option<Tenant>) -> Self {
        CordonMcp {
            svc,
            fixed,
            tool_router: Self::tool_router() + Self::snapshot_router(),
        }
    }

    fn tenant(&self, ctx: &RequestContext<RoleServer>) -> Result<Tenant, ToolError> {
        if let Some(t) = &self.fixed {
            return Ok(t.clone());
        }
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Tenant>().cloned())
            .ok_or_else(|| {
                ToolError(ApiError::new(
                    Code::Unauthorized,
                    "no API key on this MCP session",
                    "open the session with `Authorization: Bearer <api key>`",
                ))
            })
    }

    #[tool(
        title = "Run code once",
        description = "Run code once in a fresh sandbox (created, run, destroyed): lang + code (lang defaults to python), argv, or wasm_base64, with the create fields of create_sandbox (tier, trust, autonomy, limits, allow_hosts, grants, template) and files to place first. Returns the outcome: termination, exit_code, signal, stdout, stderr, usage, timings.",
        annotations(
            title = "Run code once",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn run(
        &self,
        Parameters(mut req): Parameters<RunRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecOutcome>, ToolError> {
        let t = self.tenant(&ctx)?;
        req.lang = code_lang(&req.code, req.lang);
        req.stream = false;
        let (create, exec, files) = req.split()?;
        let job = self.svc.execs().begin_run(&t, create, &exec, files).await?;
        answer(job.run(None).await)
    }

    #[tool(
        title = "Create a sandbox",
        description = "Create a sandbox that lives across calls (until destroy, its ttl or its idle timeout): the body of POST /v1/sandboxes. Returns the sandbox (its id, tier, limits, expiry).",
        annotations(
            title = "Create a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_sandbox(
        &self,
        Parameters(req): Parameters<CreateRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SandboxInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.sessions().create(&t, req).await)
    }

    #[tool(
        title = "List sandboxes",
        description = "List your live sandboxes (id, tier, state, limits, expiry, labels), optionally only those carrying every given label.",
        annotations(
            title = "List sandboxes",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_sandboxes(
        &self,
        Parameters(a): Parameters<ListSandboxesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SandboxList>, ToolError> {
        let t = self.tenant(&ctx)?;
        let labels: Vec<(String, String)> = a.labels.into_iter().collect();
        Ok(Json(SandboxList {
            sandboxes: self.svc.sessions().list(&t, &labels),
            on_disk_bytes: self.svc.sessions().on_disk_bytes(&t),
        }))
    }

    #[tool(
        title = "Describe a sandbox",
        description = "One live sandbox of yours: its tier, state, limits, expiry, idle timeout and labels.",
        annotations(
            title = "Describe a sandbox",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_sandbox(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SandboxInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.sessions().info(&t, &a.sandbox).await)
    }

    #[tool(
        title = "Create a volume",
        description = "Create a volume: a named file system of the given size (its quota) that outlives sandboxes; mount it with create_sandbox's volumes.",
        annotations(
            title = "Create a volume",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_volume(
        &self,
        Parameters(req): Parameters<VolumeCreate>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<VolumeInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.volumes().create(&t, req).await)
    }

    #[tool(
        title = "List volumes",
        description = "List your volumes (size, bytes used, the sandboxes mounting each) and your volume quota.",
        annotations(
            title = "List volumes",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_volumes(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<VolumeList>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.volumes().list(&t).await)
    }

    #[tool(
        title = "Delete a volume",
        description = "Delete a volume and its contents (refused while a sandbox mounts it).",
        annotations(
            title = "Delete a volume",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn delete_volume(
        &self,
        Parameters(a): Parameters<VolumeNameArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<VolumeDeleted>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.volumes().delete(&t, &a.name).await)
    }

    #[tool(
        title = "Run in a sandbox",
        description = "Run code (lang + code; lang defaults to python) or a program (argv) in an existing sandbox and wait for it. Returns the outcome: termination, exit_code, signal, stdout, stderr, usage, timings.",
        annotations(
            title = "Run in a sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn exec(
        &self,
        Parameters(a): Parameters<ExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecOutcome>, ToolError> {
        let t = self.tenant(&ctx)?;
        let body = ExecBody {
            lang: code_lang(&a.code, a.lang),
            code: a.code,
            argv: a.argv,
            args: a.args,
            env: a.env,
            cwd: a.cwd,
            timeout: a.timeout,
            stdin: a.stdin,
            ..ExecBody::default()
        };
        let job = self.svc.execs().begin_exec(&t, &a.sandbox, &body)?;
        answer(job.run(None).await)
    }

    #[tool(
        title = "Write a file",
        description = "Write a file under /work in a sandbox (replacing one that is there). content is text, or base64 with base64: true.",
        annotations(
            title = "Write a file",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_file(
        &self,
        Parameters(a): Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<FileWritten>, ToolError> {
        let t = self.tenant(&ctx)?;
        let data = if a.base64 {
            base64::engine::general_purpose::STANDARD
                .decode(&a.content)
                .map_err(|e| {
                    ToolError(ApiError::invalid(format!(
                        "content is not base64: {e}; send standard base64, or text with base64: false"
                    )))
                })?
        } else {
            a.content.into_bytes()
        };
        answer(
            self.svc
                .files()
                .put_file(&t, &a.sandbox, &a.path, data, 0o644)
                .await,
        )
    }

    #[tool(
        title = "Read a file",
        description = "Read a file under /work in a sandbox. Returns {path, text}, or {path, base64} for content that is not UTF-8.",
        annotations(
            title = "Read a file",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_file(
        &self,
        Parameters(a): Parameters<FileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<FileContent>, ToolError> {
        let t = self.tenant(&ctx)?;
        let data = self.svc.files().get_file(&t, &a.sandbox, &a.path).await?;
        Ok(Json(match String::from_utf8(data) {
            Ok(s) => FileContent {
                path: a.path,
                text: Some(s),
                base64: None,
            },
            Err(e) => FileContent {
                path: a.path,
                text: None,
                base64: Some(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
            },
        }))
    }

    #[tool(
        title = "List files",
        description = "List a directory under /work in a sandbox: {path, entries: [{name, kind, size, mode, mtime_ms}], truncated}. Symlinks are listed as symlinks, never followed.",
        annotations(
            title = "List files",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_files(
        &self,
        Parameters(a): Parameters<ListArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Listing>, ToolError> {
        let t = self.tenant(&ctx)?;
        let path = a.path.unwrap_or_else(|| cordon_core::WORKDIR.to_string());
        answer(self.svc.files().list(&t, &a.sandbox, path).await)
    }

    #[tool(
        title = "Stat a path",
        description = "Stat a path under /work in a sandbox: {path, name, kind, size, mode, mtime_ms}; a symlink is reported as one, not followed.",
        annotations(
            title = "Stat a path",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn stat_file(
        &self,
        Parameters(a): Parameters<FileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Stat>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.files().stat(&t, &a.sandbox, a.path).await)
    }

    #[tool(
        title = "Remove a path",
        description = "Remove a file, symlink or empty directory under /work in a sandbox; recursive removes a directory and everything beneath it.",
        annotations(
            title = "Remove a path",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn remove_path(
        &self,
        Parameters(a): Parameters<RemoveArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Done>, ToolError> {
        let op = FileOp::Remove {
            path: a.path,
            recursive: a.recursive,
        };
        self.file_done(&ctx, &a.sandbox, op).await
    }

    #[tool(
        title = "Rename a path",
        description = "Rename or move a path under /work in a sandbox.",
        annotations(
            title = "Rename a path",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn rename_path(
        &self,
        Parameters(a): Parameters<RenameArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Done>, ToolError> {
        let op = FileOp::Rename {
            from: a.from,
            to: a.to,
        };
        self.file_done(&ctx, &a.sandbox, op).await
    }

    #[tool(
        title = "Make a directory",
        description = "Make a directory under /work in a sandbox (parents: also missing parents).",
        annotations(
            title = "Make a directory",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn make_dir(
        &self,
        Parameters(a): Parameters<MkdirArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Done>, ToolError> {
        let op = FileOp::Mkdir {
            path: a.path,
            parents: a.parents,
        };
        self.file_done(&ctx, &a.sandbox, op).await
    }

    #[tool(
        title = "Start in the background",
        description = "Start code (lang + code; lang defaults to python) or a program (argv) in the background in a sandbox (a dev server, a watcher). Returns its exec id at once; read_exec shows its output, kill_exec stops it.",
        annotations(
            title = "Start in the background",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn start_background(
        &self,
        Parameters(a): Parameters<StartArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        let body = ExecBody {
            lang: code_lang(&a.code, a.lang),
            code: a.code,
            argv: a.argv,
            env: a.env,
            background: true,
            pty: a.pty,
            ..ExecBody::default()
        };
        answer(
            self.svc
                .procs()
                .start_background(&t, &a.sandbox, &body)
                .await,
        )
    }

    #[tool(
        title = "Run a code cell",
        description = "Run a cell of Python (or JavaScript) in a sandbox's long-lived interpreter: variables, imports and open files persist from one call to the next. Returns status (ok, error, timeout, died), text (the last expression's value), results (MIME bundles: image/png base64 from matplotlib or _repr_png_, text/html, application/json), logs (stdout, stderr) and error (name, value, traceback).",
        annotations(
            title = "Run a code cell",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn run_code(
        &self,
        Parameters(a): Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CellResult>, ToolError> {
        let t = self.tenant(&ctx)?;
        let cid = match a.context {
            Some(c) => c,
            None => {
                let body = ContextBody {
                    lang: a.lang.unwrap_or(ContextLang::Python).as_str().to_string(),
                    default: true,
                    cwd: None,
                };
                self.svc
                    .contexts()
                    .create_context(&t, &a.sandbox, &body)
                    .await?
                    .id
            }
        };
        let body = CellBody {
            code: a.code,
            timeout: a.timeout,
            stream: false,
            env: Default::default(),
            interrupt_when_unread: false,
        };
        answer(
            self.svc
                .contexts()
                .run_cell(&t, &a.sandbox, &cid, body, None)
                .await,
        )
    }

    #[tool(
        title = "Start a code context",
        description = "Start a code context (python, javascript or typescript) in a sandbox: a long-lived interpreter for run_code. Returns it with its id (ctx-<n>).",
        annotations(
            title = "Start a code context",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_context(
        &self,
        Parameters(a): Parameters<ContextArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ContextInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        let body = ContextBody {
            lang: a.lang.as_str().to_string(),
            default: false,
            cwd: None,
        };
        answer(
            self.svc
                .contexts()
                .create_context(&t, &a.sandbox, &body)
                .await,
        )
    }

    #[tool(
        title = "List code contexts",
        description = "List a sandbox's code contexts: id, lang, state (ready, running, dead), execution_count.",
        annotations(
            title = "List code contexts",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_contexts(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ContextList>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(
            self.svc
                .contexts()
                .list_contexts(&t, &a.sandbox)
                .map(|contexts| ContextList { contexts }),
        )
    }

    #[tool(
        title = "Restart a code context",
        description = "Restart a code context's interpreter: every variable and import is gone.",
        annotations(
            title = "Restart a code context",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn restart_context(
        &self,
        Parameters(a): Parameters<ContextIdArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ContextInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(
            self.svc
                .contexts()
                .restart_context(&t, &a.sandbox, &a.context)
                .await,
        )
    }

    #[tool(
        title = "End a code context",
        description = "End a code context (its interpreter is killed).",
        annotations(
            title = "End a code context",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn delete_context(
        &self,
        Parameters(a): Parameters<ContextIdArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ContextInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(
            self.svc
                .contexts()
                .delete_context(&t, &a.sandbox, &a.context)
                .await,
        )
    }

    #[tool(
        title = "List background execs",
        description = "List a sandbox's background execs: id, command, state (running or exited), started_ms, exit_code.",
        annotations(
            title = "List background execs",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_execs(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecList>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(
            self.svc
                .procs()
                .list_execs(&t, &a.sandbox)
                .await
                .map(|execs| ExecList { execs }),
        )
    }

    #[tool(
        title = "Read a background exec",
        description = "Read a background exec's output so far (the last 1 MiB of each stream) and its state, without waiting.",
        annotations(
            title = "Read a background exec",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_exec(
        &self,
        Parameters(a): Parameters<ExecIdArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecPeek>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.procs().peek_exec(&t, &a.sandbox, &a.exec).await)
    }

    #[tool(
        title = "Resize a terminal",
        description = "Resize a background exec's pseudo-terminal (one started with pty): its program gets SIGWINCH and sees the new rows and cols.",
        annotations(
            title = "Resize a terminal",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn resize_exec(
        &self,
        Parameters(a): Parameters<ResizeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        let size = cordon_core::PtySize {
            rows: a.rows,
            cols: a.cols,
        };
        answer(
            self.svc
                .procs()
                .exec_resize(&t, &a.sandbox, &a.exec, size)
                .await,
        )
    }

    #[tool(
        title = "Stop a background exec",
        description = "Stop a background exec: SIGTERM to its process tree, SIGKILL after a grace (force: at once).",
        annotations(
            title = "Stop a background exec",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn kill_exec(
        &self,
        Parameters(a): Parameters<KillArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(
            self.svc
                .procs()
                .exec_signal(&t, &a.sandbox, &a.exec, a.force)
                .await,
        )
    }

    #[tool(
        title = "Pause a sandbox",
        description = "Pause a sandbox: its processes stop (no CPU), its memory stays, its TTL clock stands still; execs are refused until resume_sandbox. to_disk (microvm only) saves it to disk and frees its memory; it survives a server restart.",
        annotations(
            title = "Pause a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn pause_sandbox(
        &self,
        Parameters(a): Parameters<PauseArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SandboxInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        let mode = match PauseMode::of(a.to_disk, a.files_only) {
            Ok(m) => m,
            Err(e) => return answer(Err(e)),
        };
        answer(self.svc.sessions().pause(&t, &a.sandbox, mode).await)
    }

    #[tool(
        title = "Resume a sandbox",
        description = "Resume a paused sandbox; its processes continue where they stopped.",
        annotations(
            title = "Resume a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn resume_sandbox(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SandboxInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.sessions().resume(&t, &a.sandbox).await)
    }

    #[tool(
        title = "Change a sandbox's lifetime",
        description = "Change a sandbox's ttl (from its creation) or idle_timeout, within the server's maxima.",
        annotations(
            title = "Change a sandbox's lifetime",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn update_sandbox(
        &self,
        Parameters(a): Parameters<UpdateArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SandboxInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        let req = PatchRequest {
            ttl: a.ttl,
            idle_timeout: a.idle_timeout,
        };
        answer(self.svc.sessions().patch(&t, &a.sandbox, req).await)
    }

    #[tool(
        title = "Destroy a sandbox",
        description = "Destroy a sandbox and everything in it (idempotent: destroying it again answers already: true).",
        annotations(
            title = "Destroy a sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn destroy(
        &self,
        Parameters(a): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Destroyed>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(self.svc.sessions().destroy(&t, &a.sandbox).await)
    }

    #[tool(
        title = "Read the audit log",
        description = "Your audit rows, oldest first: every create, exec, file call, egress decision and destroy, with its decision and detail. Filter by sandbox, kind (create, exec, egress, destroy, ...), since_ms, after_id (paging); limit defaults to 100, at most 1000.",
        annotations(
            title = "Read the audit log",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn audit(
        &self,
        Parameters(q): Parameters<AuditQuery>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<AuditEvents>, ToolError> {
        let t = self.tenant(&ctx)?;
        if let Some(s) = &q.sandbox
            && SandboxId::parse(s).is_none()
        {
            return Err(ToolError(ApiError::invalid(
                "sandbox must be an id like sb-<32 hex digits>",
            )));
        }
        answer(
            self.svc
                .audit_query(&t, q)
                .await
                .map(|events| AuditEvents { events }),
        )
    }
}

impl CordonMcp {
    /// A remove, rename or mkdir, answered as the API answers it.
    async fn file_done(
        &self,
        ctx: &RequestContext<RoleServer>,
        sandbox: &str,
        op: FileOp,
    ) -> Result<Json<Done>, ToolError> {
        let t = self.tenant(ctx)?;
        answer(self.svc.files().done(&t, sandbox, op).await)
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
        .map_err(|e| ServerError::io("starting the MCP session", std::io::Error::other(e)))?;
    running
        .waiting()
        .await
        .map_err(|e| ServerError::io("MCP session", std::io::Error::other(e)))?;
    Ok(())
}
