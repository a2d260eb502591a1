//! Per-sandbox limits and the request-rate limiter.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Limits of one sandbox's egress. Reaching one ends the connection (or refuses the request)
/// and records the reason in the audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressLimits {
    /// Bytes the sandbox may send, over all its connections (counted on the client side,
    /// request heads and TLS records included).
    pub max_bytes_up: u64,
    /// Bytes the sandbox may receive, over all its connections.
    pub max_bytes_down: u64,
    /// Client connections open at once.
    pub max_connections: u32,
    /// Sustained requests per second (HTTP requests, CONNECTs and requests inside
    /// terminated TLS all count).
    pub requests_per_second: f64,
    /// Requests allowed in a burst above the sustained rate.
    pub request_burst: u32,
    /// Requests in the sandbox's whole life; `None` for no cap.
    pub max_requests: Option<u64>,
    /// A connection with no byte in either direction for this long is closed (ms).
    pub idle_timeout_ms: u64,
    /// A connection open longer than this is closed, busy or not (ms).
    pub connection_timeout_ms: u64,
    /// Time to resolve a name and connect upstream, TLS handshake included (ms).
    pub connect_timeout_ms: u64,
    /// Largest request head the proxy reads (bytes, at least 8192).
    pub max_header_bytes: usize,
}

impl Default for EgressLimits {
    fn default() -> Self {
        EgressLimits {
            max_bytes_up: 64 << 20,
            max_bytes_down: 1 << 30,
            max_connections: 32,
            requests_per_second: 50.0,
            request_burst: 100,
            max_requests: None,
            idle_timeout_ms: 60_000,
            connection_timeout_ms: 600_000,
            connect_timeout_ms: 10_000,
            max_header_bytes: 64 << 10,
        }
    }
}

impl EgressLimits {
    /// Checks every limit is usable.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &'static str, reason: &str| {
            Err(Error::Limit {
                what,
                reason: reason.to_string(),
            })
        };
        if self.max_connections == 0 {
            return bad("max_connections", "is zero; give at least 1");
        }
        if !(self.requests_per_second.is_finite() && self.requests_per_second > 0.0) {
            return bad("requests_per_second", "must be a positive number");
        }
        if self.request_burst == 0 {
            return bad("request_burst", "is zero; give at least 1");
        }
        if self.idle_timeout_ms == 0
            || self.connection_timeout_ms == 0
            || self.connect_timeout_ms == 0
        {
            return bad("timeouts", "a timeout is zero; give milliseconds > 0");
        }
        if self.max_header_bytes < 8192 {
            return bad("max_header_bytes", "is below 8192");
        }
        Ok(())
    }

    pub(crate) fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub(crate) fn connection_timeout(&self) -> Duration {
        Duration::from_millis(self.connection_timeout_ms)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

/// A token bucket.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub(crate) fn new(rate: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one token if there is one.
    pub(crate) fn try_take(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let elapsed = now.duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * self.rate).min(self.burst);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_refuses() {
        let r = RateLimiter::new(0.001, 5);
        let ok = (0..20).filter(|_| r.try_take()).count();
        assert_eq!(ok, 5);
    }

    #[test]
    fn bucket_refills() {
        let r = RateLimiter::new(1000.0, 1);
        assert!(r.try_take());
        std::thread::sleep(Duration::from_millis(5));
        assert!(r.try_take());
    }

    #[test]
    fn zero_limits_are_refused() {
        let l = EgressLimits {
            max_connections: 0,
            ..Default::default()
        };
        assert!(l.validate().is_err());
        let l = EgressLimits {
            requests_per_second: f64::NAN,
            ..Default::default()
        };
        assert!(l.validate().is_err());
        assert!(EgressLimits::default().validate().is_ok());
    }
}
