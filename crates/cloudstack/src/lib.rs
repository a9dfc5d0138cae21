//! The CloudStack API client: request signing, envelopes, async jobs, error mapping,
//! timeouts. The only code in the provider that talks HTTP to CloudStack.
//!
//! Secrets (the API key's secret, signatures) never appear in logs, errors or `Debug` output.
//!
//! One type, [`Client`], in parts apart by what each answers to: `client` the request (signing,
//! transport, the answer read into a typed value or a [`CsError`]), `envelope` CloudStack's
//! answer conventions, `paging` the list-command contract and its learned page limit, `jobs`
//! async jobs and their search, `commands` the typed calls the provider makes, `pace` how fast
//! requests go (the client's rate limit, and the waits after CloudStack's throttling).

pub mod error;
pub mod keys;
pub mod redact;
pub mod sign;
pub mod types;

mod client;
mod commands;
mod envelope;
mod jobs;
mod pace;
mod paging;

pub use client::{Client, ClientConfig, DEFAULT_SIGNATURE_EXPIRY, record_request_metrics};
pub use error::{Class, CsError, Transport, UrlProblem};
pub use keys::{KeyPair, KeySource};

/// The target of this crate's log events: the crate's name, whichever of its files logs, so
/// one filter (`cks_cloudstack=…`) and one name in the logs cover the whole client.
const LOG_TARGET: &str = "cks_cloudstack";

#[cfg(test)]
mod tests;
