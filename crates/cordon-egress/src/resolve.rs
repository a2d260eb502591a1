//! Name resolution, done by the proxy itself so that the address it checks is the address it
//! connects to. Pluggable so tests (and callers with their own DNS) can inject answers.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// A boxed future returned by [`Resolver::resolve`].
pub type ResolveFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Turns a host name into addresses. The proxy calls it once per connection and connects
/// only to addresses from that answer that passed the guard.
pub trait Resolver: Send + Sync + 'static {
    /// Resolves `host` (a validated DNS name, never an IP literal).
    fn resolve(&self, host: &str) -> ResolveFuture;
}

/// The host's resolver (`getaddrinfo` on a blocking thread, via tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, host: &str) -> ResolveFuture {
        let host = host.to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let mut out: Vec<IpAddr> = Vec::new();
            for a in addrs {
                if !out.contains(&a.ip()) {
                    out.push(a.ip());
                }
            }
            Ok(out)
        })
    }
}

/// A fixed table of answers; names not in it fail to resolve. For tests and for callers that
/// pin names to addresses.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    table: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
}

impl StaticResolver {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or replaces) the answer for `host`; later lookups see the new answer, which is
    /// how tests simulate DNS rebinding.
    pub fn set(&self, host: &str, addrs: &[IpAddr]) -> &Self {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.insert(host.to_ascii_lowercase(), addrs.to_vec());
        self
    }
}

impl Resolver for StaticResolver {
    fn resolve(&self, host: &str) -> ResolveFuture {
        let answer = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&host.to_ascii_lowercase())
            .cloned();
        let host = host.to_string();
        Box::pin(async move {
            match answer {
                Some(a) if !a.is_empty() => Ok(a),
                _ => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no address for {host}"),
                )),
            }
        })
    }
}
