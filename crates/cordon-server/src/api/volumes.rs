//! The volume routes: create, list, get and delete a tenant's volumes.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use axum::extract::DefaultBodyLimit;

use super::extract::{Auth, json_rejection};
use crate::config::HttpLimits;
use crate::error::{ApiError, Code};
use crate::model as m;
use crate::openapi::{Api, Op};
use crate::service::Service;

/// This resource's routes and their operations.
pub(super) fn routes(limits: &HttpLimits) -> Api {
    Api::default()
        .op(
            Op::post("/v1/volumes", "createVolume", "volumes")
                .summary("Create a volume of mine: an empty file system of `size` bytes (its quota) that outlives sandboxes; refused past my ceiling (403 volume_quota) or with a name I have (409 volume_exists)")
                .json::<m::VolumeCreate>()
                .ok::<m::VolumeInfo>(201, "created")
                .errors(&[Code::VolumeExists, Code::VolumeQuota, Code::StorageLow, Code::ShuttingDown, Code::Unsupported]),
            create_volume,
        )
        .op(
            Op::get("/v1/volumes", "listVolumes", "volumes")
                .summary("My volumes, with the bytes they count against my volume ceiling")
                .ok::<m::VolumeList>(200, "my volumes"),
            list_volumes,
        )
        .op(
            Op::get("/v1/volumes/{name}", "getVolume", "volumes")
                .summary("One of my volumes (another tenant's is 404)")
                .ok::<m::VolumeInfo>(200, "the volume")
                .errors(&[Code::NotFound]),
            volume,
        )
        .op(
            Op::delete("/v1/volumes/{name}", "deleteVolume", "volumes")
                .summary("Delete one of my volumes and its contents; refused while a sandbox mounts it (409 volume_in_use)")
                .ok::<m::VolumeDeleted>(200, "deleted")
                .errors(&[Code::NotFound, Code::VolumeInUse, Code::ShuttingDown]),
            delete_volume,
        )
        .map(|r| r.layer(DefaultBodyLimit::max(limits.max_body_bytes)))
}

async fn create_volume(
    State(svc): State<Service>,
    Auth(t): Auth,
    body: Result<Json<crate::model::VolumeCreate>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(json_rejection)?;
    let info = svc.volumes().create(&t, req).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn list_volumes(
    State(svc): State<Service>,
    Auth(t): Auth,
) -> Result<Json<crate::model::VolumeList>, ApiError> {
    Ok(Json(svc.volumes().list(&t).await?))
}

async fn volume(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(name): Path<String>,
) -> Result<Json<crate::model::VolumeInfo>, ApiError> {
    Ok(Json(svc.volumes().get(&t, &name).await?))
}

async fn delete_volume(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path(name): Path<String>,
) -> Result<Json<crate::model::VolumeDeleted>, ApiError> {
    Ok(Json(svc.volumes().delete(&t, &name).await?))
}
