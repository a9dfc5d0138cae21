//! The key pair each request is signed with, and where it comes from. The client asks its
//! [`KeySource`] once per request instead of keeping the pair it was built with, so that a key
//! rotated in CloudStack can be replaced while the client (its pool, its learned limits) stays:
//! where the new pair comes from (files, a Secret) is the caller's business, not the client's.

use std::fmt;
use std::sync::Arc;

/// An API key and its secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPair {
    pub api_key: String,
    pub secret_key: String,
}

impl KeyPair {
    pub fn new(api_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        KeyPair {
            api_key: api_key.into(),
            secret_key: secret_key.into(),
        }
    }

    /// Neither key is empty. A request signed with an empty key can only be refused, and
    /// would be refused as a bad key, hiding why.
    pub fn is_complete(&self) -> bool {
        !self.api_key.is_empty() && !self.secret_key.is_empty()
    }
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPair")
            .field("api_key", &crate::redact::mask(&self.api_key))
            .field("secret_key", &"***")
            .finish()
    }
}

/// Where the client takes the key pair of each request from.
pub trait KeySource: Send + Sync {
    /// The pair the next request is signed with. Called once per request, so it should be
    /// cheap; it should never hand out an incomplete pair (the client refuses to sign with
    /// one rather than send it).
    fn current(&self) -> Arc<KeyPair>;
}

/// The same pair for the client's whole life: the keys of its [`ClientConfig`](crate::ClientConfig).
pub(crate) struct FixedKeys(pub(crate) Arc<KeyPair>);

impl KeySource for FixedKeys {
    fn current(&self) -> Arc<KeyPair> {
        self.0.clone()
    }
}
