//! The proxy itself, one module per step a connection goes through. Each module uses only
//! those listed above it:
//! - `answer`: the proxy's own answers (refusals naming their rule) and their audit rows;
//! - `decide`: request-rate and request-count limits, a host's method and path rules;
//! - `upstream`: resolving once, checking every address, connecting, HTTP/1 handshakes,
//!   kept-alive upstream connections, hop-by-hop headers;
//! - `grants`: a grant's refusal, placeholders headed elsewhere, masking secrets in
//!   responses;
//! - `tunnel`: opaque CONNECT tunnels (placeholders watched, the TLS server name checked);
//! - `terminate`: the requests inside a TLS connection terminated for a granted host;
//! - `http`: the plain-HTTP front (absolute-form requests);
//! - `connect`: the CONNECT front (a tunnel or a terminated TLS leg);
//! - `accept`: the accept loops, connection admission and the dispatch to a front.

mod accept;
mod answer;
mod connect;
mod decide;
mod grants;
mod http;
mod terminate;
mod tunnel;
mod upstream;

pub(crate) use accept::{accept_tcp, accept_unix};
