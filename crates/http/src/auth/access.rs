//! The one authorization decision. Every surface (Durable Streams, the native record
//! API, trim and retention, consumer groups, subscriptions, positions, tokens,
//! listing, maintenance, metrics, the cluster's admin calls) asks [`Access`], for
//! every stream a request touches, directly or indirectly, with the operation it
//! actually performs there: append for a wake or dead-letter stream, read for a
//! linked, glob-matched, claimed or forked-from stream.
//!
//! Three rules hold for every answer:
//! - A token's namespace is applied to every name in (`Access::stream`) and taken
//!   off every name out (`Access::shown`); a name outside it is never shown.
//! - Refusals are decided from the name and the token alone, before any lookup, so a
//!   refusal never says whether the stream exists. Surfaces that find a stream only
//!   by looking something up (a group's stream) answer "not found" for what the
//!   caller may not see, the same answer as for what is missing.
//! - Streams whose first segment starts with `__` hold the server's own state
//!   (groups, positions, subscriptions): no request reaches them as streams, with or
//!   without authentication; only their own APIs use them.

use std::sync::Arc;

use axum::http::StatusCode;

use super::{forbidden, Auth, Op, Pattern, Principal, Token};
use crate::error::ApiError;

/// Whether `name` (absolute) is one of the server's own streams.
pub fn is_reserved(name: &str) -> bool {
    name.starts_with("__")
}

/// The error for a reserved name reached as a stream.
pub fn reserved() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "reserved_path",
        "paths whose first segment starts with __ are reserved for server APIs",
    )
}

/// The caller of one request, as far as authorization goes.
#[derive(Clone, Copy)]
pub struct Access<'a> {
    /// `None`: `--auth off`, everyone may do everything but touch reserved streams.
    auth: Option<&'a Auth>,
    principal: Option<&'a Principal>,
}

impl<'a> Access<'a> {
    pub fn new(auth: Option<&'a Arc<Auth>>, principal: Option<&'a Principal>) -> Access<'a> {
        Access {
            auth: auth.map(|a| a.as_ref()),
            principal,
        }
    }

    /// Whether authentication is off (a development server).
    pub fn is_open(&self) -> bool {
        self.auth.is_none()
    }

    fn token(&self) -> Option<&'a Arc<Token>> {
        match self.principal {
            Some(Principal::Token(t)) => Some(t),
            _ => None,
        }
    }

    /// The caller's namespace: what its names are relative to.
    pub fn namespace(&self) -> &'a str {
        self.token().map_or("", |t| t.namespace.as_str())
    }

    /// The absolute name the caller means by `addressed`.
    pub fn absolute(&self, addressed: &str) -> String {
        format!("{}{addressed}", self.namespace())
    }

    /// The absolute `name` as the caller addresses it; `None` if it lies outside the
    /// caller's namespace (and must not be shown).
    pub fn shown<'n>(&self, name: &'n str) -> Option<&'n str> {
        name.strip_prefix(self.namespace())
    }

    /// Whether the caller may do `op` on the absolute stream `name`. Never on a
    /// reserved stream.
    pub fn allows(&self, op: Op, name: &str) -> bool {
        if is_reserved(name) {
            return false;
        }
        let Some(auth) = self.auth else { return true };
        match self.principal {
            None => false,
            Some(Principal::Token(t)) => t.allows(op, name),
            Some(Principal::ReadLink { expires_secs, mac }) => {
                op == Op::Read && auth.read_key.verify(name, *expires_secs, mac)
            }
        }
    }

    /// Why the caller may not do `op` on a stream: 401 without a credential, 403
    /// otherwise. Says nothing of the stream itself.
    fn refusal(&self, op: Op) -> ApiError {
        match self.principal {
            None => Auth::missing(),
            Some(Principal::ReadLink { .. }) if op == Op::Read => super::unauthorized(
                "invalid_token",
                "the read token is not valid for this stream",
            ),
            Some(Principal::ReadLink { .. }) => forbidden("a read token allows reads only"),
            Some(Principal::Token(_)) => {
                forbidden(format!("this token may not {} this stream", op.name()))
            }
        }
    }

    /// A stream the request addresses (relative to the caller's namespace): its
    /// absolute name, if the caller may do `op` on it.
    /// Without a namespace the name is handed back as it came: no copy on the hot path.
    pub fn stream(&self, op: Op, addressed: String) -> Result<String, ApiError> {
        if is_reserved(&addressed) {
            return Err(reserved());
        }
        let namespace = self.namespace();
        let name = if namespace.is_empty() {
            addressed
        } else {
            format!("{namespace}{addressed}")
        };
        if is_reserved(&name) {
            return Err(reserved());
        }
        if self.allows(op, &name) {
            Ok(name)
        } else {
            Err(self.refusal(op))
        }
    }

    /// A stream the request reaches indirectly, by its absolute name (a wake stream,
    /// a dead-letter stream, a linked stream, a fork's source).
    pub fn reach(&self, op: Op, name: &str) -> Result<(), ApiError> {
        if self.allows(op, name) {
            Ok(())
        } else if is_reserved(name) {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "reserved_stream",
                "streams whose first segment starts with __ hold server state and cannot be used here",
            ))
        } else {
            Err(self.refusal(op))
        }
    }

    /// Every stream a name pattern (absolute) can ever match: the caller must hold
    /// `op` on all of it (a subscription's glob reads whatever comes to match it).
    pub fn pattern(&self, op: Op, pattern: &Pattern) -> Result<(), ApiError> {
        if self.auth.is_none() {
            return Ok(());
        }
        let covered = self.token().is_some_and(|t| {
            t.absolute
                .iter()
                .any(|(ops, p)| ops.has(op) && p.covers(pattern))
        });
        if covered {
            Ok(())
        } else if self.principal.is_none() {
            Err(Auth::missing())
        } else {
            Err(forbidden(format!(
                "this token may not {} every stream the pattern can match",
                op.name()
            )))
        }
    }

    /// A subscription's own path (`{root}__ds/subscriptions/{id}`, relative to the
    /// caller's namespace): its absolute path, if the caller may do `op` on it.
    /// The path lives under the reserved `__ds` segment, so the reserved-name rule
    /// is the subscription API's own here.
    pub fn subscription(&self, op: Op, addressed: &str) -> Result<String, ApiError> {
        let path = self.absolute(addressed);
        if self.allows_subscription(op, &path) {
            Ok(path)
        } else {
            Err(self.refusal(op))
        }
    }

    /// Whether the caller may do `op` on the subscription at the absolute `path`.
    pub fn allows_subscription(&self, op: Op, path: &str) -> bool {
        self.auth.is_none() || self.token().is_some_and(|t| t.allows(op, path))
    }

    /// A node-wide operation (`admin`, `tokens`, or listing what a scope shows):
    /// the caller's token, `None` when authentication is off.
    pub fn node(&self, op: Op) -> Result<Option<Arc<Token>>, ApiError> {
        match self.auth {
            None => Ok(None),
            Some(auth) => auth.require_op(self.principal, op).map(Some),
        }
    }

    /// With authentication on, a request without a credential is refused (401)
    /// before anything is looked up.
    pub fn authenticated(&self) -> Result<(), ApiError> {
        if self.auth.is_some() && self.principal.is_none() {
            Err(Auth::missing())
        } else {
            Ok(())
        }
    }
}
