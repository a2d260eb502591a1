//! A sandbox's own servers from outside: `/v1/sandboxes/{id}/ports/{port}/...` relays the
//! request (any of the usual methods, its path after the port and its query) to `port` on
//! the sandbox's own loopback, with the caller's key: the sandbox must be the caller's
//! tenant's. The key and Cordon's headers are not passed on ([`crate::portproxy`]).

use axum::extract::{Path, Request, State};
use axum::response::Response;

use super::extract::{Auth, parse_id};
use crate::error::{ApiError, Code};
use crate::openapi::{Api, Op, SANDBOX};
use crate::service::{Opened, Service};

const SUMMARY: &str = "Relay a request to a port a program serves on the sandbox's own loopback (a server a background exec started), its path the rest after the port; audited (port_open); at most 64 connections to one sandbox's ports at once";

/// This resource's routes and their operations (no body limit: the body streams through).
pub(super) fn routes() -> Api {
    let ops = [
        Op::get("/v1/sandboxes/{id}/ports/{port}", "portGetBare", "ports"),
        Op::get("/v1/sandboxes/{id}/ports/{port}/", "portGetRoot", "ports"),
        Op::get(
            "/v1/sandboxes/{id}/ports/{port}/{*rest}",
            "portGet",
            "ports",
        ),
        Op::post(
            "/v1/sandboxes/{id}/ports/{port}/{*rest}",
            "portPost",
            "ports",
        ),
        Op::put(
            "/v1/sandboxes/{id}/ports/{port}/{*rest}",
            "portPut",
            "ports",
        ),
        Op::delete(
            "/v1/sandboxes/{id}/ports/{port}/{*rest}",
            "portDelete",
            "ports",
        ),
        Op::patch(
            "/v1/sandboxes/{id}/ports/{port}/{*rest}",
            "portPatch",
            "ports",
        ),
    ];
    let mut api = Api::default();
    for (i, op) in ops.into_iter().enumerate() {
        let op = op
            .summary(SUMMARY)
            .body("*/*", None)
            .body_optional()
            .answer(200, "the program's answer, as it gave it", "*/*", None)
            .errors(SANDBOX)
            .errors(&[
                Code::InvalidRequest,
                Code::SandboxBusy,
                Code::ResourceBusy,
                Code::Unsupported,
            ]);
        // The port's root, with and without the slash (relative links in a page resolve
        // under it only with the slash).
        api = if i < 2 {
            api.op(op, root)
        } else {
            api.op(op, relay)
        };
    }
    api
}

async fn root(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, port)): Path<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    forward(&svc, &t, &id, &port, "", req).await
}

async fn relay(
    State(svc): State<Service>,
    Auth(t): Auth,
    Path((id, port, rest)): Path<(String, String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    forward(&svc, &t, &id, &port, &rest, req).await
}

async fn forward(
    svc: &Service,
    t: &crate::keys::Tenant,
    id: &str,
    port: &str,
    rest: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let id = parse_id(id)?;
    let port: u16 = port.parse().map_err(|_| {
        ApiError::invalid(format!(
            "{port:?} is not a port: name a number from 1 to 65535"
        ))
    })?;
    match svc.sessions().open_port(t, &id, port, "api").await? {
        Opened::Conn(conn) => {
            let path = crate::portproxy::target(rest, req.uri());
            crate::portproxy::forward(conn, req, &path, crate::portproxy::Credentials::Bearer)
                .await
                .map_err(|e| {
                    ApiError::new(
                        Code::SandboxFailure,
                        e.to_string(),
                        "check that the program on the port speaks HTTP/1.1",
                    )
                })
        }
        Opened::Closed => Err(ApiError::new(
            Code::NotFound,
            format!("nothing listens on port {port} in sandbox {id}"),
            "start your server first (a background exec), listening on 127.0.0.1 or 0.0.0.0",
        )),
    }
}
