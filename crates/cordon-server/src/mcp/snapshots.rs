//! The snapshot tools (issue 46): take a snapshot of a sandbox, list and delete snapshots,
//! start sandboxes from one, fork a sandbox. The same service calls as the API's routes.

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use serde::Deserialize;

use cordon_core::SnapshotMode;
use cordon_core::units::Dur;

use super::{CordonMcp, ToolError, answer};
use crate::model::{SnapshotDeleted, SnapshotInfo, SnapshotList, StartedFromSnapshot};
use crate::service::StartOptions;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    /// The sandbox's id (sb-...).
    pub sandbox: String,
    /// A name of your own for the snapshot (1 to 64 of a-z 0-9 . _ -).
    #[serde(default)]
    pub name: Option<String>,
    /// full (memory, processes, files) or filesystem (files; processes start fresh); left
    /// out, the most the sandbox's tier keeps.
    #[serde(default)]
    pub mode: Option<SnapshotMode>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotKeyArgs {
    /// The snapshot's id (snap-...) or name.
    pub snapshot: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartArgs {
    /// The snapshot's id (snap-...) or name (start_from_snapshot), or the sandbox's id
    /// (fork_sandbox).
    pub from: String,
    /// How many sandboxes, 1 to 20 (default 1).
    #[serde(default)]
    pub count: Option<u32>,
    #[serde(default)]
    pub ttl: Option<Dur>,
    #[serde(default)]
    pub idle_timeout: Option<Dur>,
}

impl StartArgs {
    fn options(&self) -> StartOptions {
        StartOptions {
            ttl: self.ttl,
            idle_timeout: self.idle_timeout,
            labels: Default::default(),
        }
    }
}

fn split(
    snapshot: String,
    started: Vec<Result<crate::model::SandboxInfo, crate::error::ApiError>>,
) -> StartedFromSnapshot {
    let (mut sandboxes, mut errors) = (Vec::new(), Vec::new());
    for s in started {
        match s {
            Ok(i) => sandboxes.push(i),
            Err(e) => errors.push(e),
        }
    }
    StartedFromSnapshot {
        snapshot,
        sandboxes,
        errors,
    }
}

#[tool_router(router = snapshot_router, vis = "pub(super)")]
impl CordonMcp {
    #[tool(
        title = "Take a snapshot",
        description = "Take a snapshot of a live sandbox, kept until you delete it (it outlives the sandbox and a server restart) and counted in your max_snapshot_bytes: mode full (memory, processes, files; where the tier can) or filesystem (files; processes start fresh). The sandbox runs on.",
        annotations(
            title = "Take a snapshot",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_snapshot(
        &self,
        Parameters(a): Parameters<SnapshotArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SnapshotInfo>, ToolError> {
        let t = self.tenant(&ctx)?;
        answer(
            self.svc
                .snapshots()
                .take(&t, &a.sandbox, a.name, a.mode)
                .await,
        )
    }

    #[tool(
        title = "List snapshots",
        description = "List your snapshots (id, name, tier, mode, bytes, the sandbox each was taken of).",
        annotations(
            title = "List snapshots",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_snapshots(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SnapshotList>, ToolError> {
        let t = self.tenant(&ctx)?;
        let snapshots = self.svc.snapshots().list(&t).await?;
        Ok(Json(SnapshotList { snapshots }))
    }

    #[tool(
        title = "Delete a snapshot",
        description = "Delete one of your snapshots (by id or name) and its image; sandboxes started from it live on.",
        annotations(
            title = "Delete a snapshot",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn delete_snapshot(
        &self,
        Parameters(a): Parameters<SnapshotKeyArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SnapshotDeleted>, ToolError> {
        let t = self.tenant(&ctx)?;
        let id = self.svc.snapshots().get(&t, &a.snapshot).await?.id;
        self.svc.snapshots().delete(&t, &id).await?;
        Ok(Json(SnapshotDeleted { id }))
    }

    #[tool(
        title = "Start from a snapshot",
        description = "Start 1 to 20 sandboxes from one of your snapshots (by id or name): each a create with the snapshot's spec (never wider), its own id, files, network identity and TTL. Answers those that started and why others did not.",
        annotations(
            title = "Start from a snapshot",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn start_from_snapshot(
        &self,
        Parameters(a): Parameters<StartArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<StartedFromSnapshot>, ToolError> {
        let t = self.tenant(&ctx)?;
        let id = self.svc.snapshots().get(&t, &a.from).await?.id;
        let started = self
            .svc
            .snapshots()
            .start(&t, &id, a.count.unwrap_or(1), a.options())
            .await?;
        Ok(Json(split(id, started)))
    }

    #[tool(
        title = "Fork a sandbox",
        description = "Fork a live sandbox: a snapshot of it taken now (full where its tier can, else filesystem), 1 to 20 sandboxes started from it, the snapshot then deleted.",
        annotations(
            title = "Fork a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn fork_sandbox(
        &self,
        Parameters(a): Parameters<StartArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<StartedFromSnapshot>, ToolError> {
        let t = self.tenant(&ctx)?;
        let (snap, started) = self
            .svc
            .snapshots()
            .fork(&t, &a.from, a.count.unwrap_or(1), a.options())
            .await?;
        Ok(Json(split(snap, started)))
    }
}
