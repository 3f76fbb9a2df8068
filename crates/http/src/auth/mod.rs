//! Who may do what. `Auth` holds every token in memory (loaded from the engine at
//! start, written through it on every change: durable in the WAL before the answer),
//! authenticates requests
//! (`Authorization: Bearer`, or a signed read token in the query of a read) and
//! authorizes an operation on a stream name, mapping it into the token's namespace.
//! Absent entirely when the server runs with `--auth off`.

pub mod access;
pub mod credential;
pub mod quota;
pub mod scope;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode};
use picomq_engine::{Engine, TokenRecord};

use crate::error::ApiError;
pub use access::Access;
use credential::{ReadTokenError, ReadTokenKey, SecretHash};
pub use scope::{Op, Ops, Pattern, Scope};

/// Id of the token read from `--bootstrap-token-file`.
pub const BOOTSTRAP_ID: &str = "bootstrap";
/// Realm named in `WWW-Authenticate`.
const REALM: &str = "picomq";

#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// Most tokens the server holds (revoked ones included).
    pub tokens_max: usize,
    /// Longest life of a signed read token.
    pub read_token_ttl_max: Duration,
    /// Most streams under one token namespace (`None`: no cap).
    pub streams_per_namespace_max: Option<u64>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            tokens_max: 10_000,
            read_token_ttl_max: Duration::from_secs(3600),
            streams_per_namespace_max: None,
        }
    }
}

/// A token as the server uses it.
#[derive(Clone, Debug)]
pub struct Token {
    pub id: String,
    pub parent_id: Option<String>,
    pub description: String,
    /// Scopes as issued, relative to `namespace`.
    pub scopes: Vec<Scope>,
    /// The same patterns with the namespace applied: what names are matched against.
    pub absolute: Vec<(Ops, Pattern)>,
    pub namespace: String,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
    secret_hash: SecretHash,
}

impl Token {
    fn from_record(row: &TokenRecord) -> Result<Token, String> {
        let scopes = row
            .scopes
            .lines()
            .map(Scope::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let secret_hash = row
            .secret_hash
            .as_slice()
            .try_into()
            .map_err(|_| format!("token {}: stored hash is not 32 bytes", row.id))?;
        Ok(Token::new(
            row.id.clone(),
            row.parent_id.clone(),
            row.description.clone(),
            scopes,
            row.namespace.clone(),
            row.created_ms,
            row.expires_ms,
            row.revoked_ms,
            secret_hash,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        id: String,
        parent_id: Option<String>,
        description: String,
        scopes: Vec<Scope>,
        namespace: String,
        created_ms: u64,
        expires_ms: Option<u64>,
        revoked_ms: Option<u64>,
        secret_hash: SecretHash,
    ) -> Token {
        let absolute = scopes
            .iter()
            .map(|s| (s.ops, s.pattern.under(&namespace)))
            .collect();
        Token {
            id,
            parent_id,
            description,
            scopes,
            absolute,
            namespace,
            created_ms,
            expires_ms,
            revoked_ms,
            secret_hash,
        }
    }

    fn record(&self) -> TokenRecord {
        TokenRecord {
            id: self.id.clone(),
            secret_hash: self.secret_hash.to_vec(),
            parent_id: self.parent_id.clone(),
            description: self.description.clone(),
            scopes: self
                .scopes
                .iter()
                .map(|s| s.text.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            namespace: self.namespace.clone(),
            created_ms: self.created_ms,
            expires_ms: self.expires_ms,
            revoked_ms: self.revoked_ms,
        }
    }

    /// May do `op` on the absolute stream name `name`.
    pub fn allows(&self, op: Op, name: &str) -> bool {
        self.absolute
            .iter()
            .any(|(ops, p)| ops.has(op) && p.matches(name))
    }

    /// Holds `op` on every name (`**`, outside any namespace): what node-wide
    /// settings need. `*` is not every name, though it matches the empty one.
    pub fn has_op_everywhere(&self, op: Op) -> bool {
        self.absolute
            .iter()
            .any(|(ops, p)| ops.has(op) && matches!(p, Pattern::Prefix(s) if s.is_empty()))
    }

    /// May do `op` on every name `pattern` matches (a scope's pattern covers it).
    pub fn covers(&self, op: Op, pattern: &Pattern) -> bool {
        self.absolute
            .iter()
            .any(|(ops, p)| ops.has(op) && p.covers(pattern))
    }

    /// Holds `op` on some pattern (for node-wide operations).
    pub fn has_op(&self, op: Op) -> bool {
        self.absolute.iter().any(|(ops, _)| ops.has(op))
    }

    fn is_live(&self, now_ms: u64) -> bool {
        self.revoked_ms.is_none() && self.expires_ms.is_none_or(|e| e > now_ms)
    }
}

/// The authenticated caller of one request (a request extension).
#[derive(Clone, Debug)]
pub enum Principal {
    Token(Arc<Token>),
    /// A signed read token from the query string, verified against the stream name
    /// once the name is known.
    ReadLink {
        expires_secs: u64,
        mac: Vec<u8>,
    },
}

#[derive(Default)]
struct Tokens {
    by_hash: HashMap<SecretHash, Arc<Token>>,
    by_id: HashMap<String, Arc<Token>>,
}

impl Tokens {
    fn insert(&mut self, t: Arc<Token>) {
        if let Some(old) = self.by_id.insert(t.id.clone(), t.clone()) {
            self.by_hash.remove(&old.secret_hash);
        }
        self.by_hash.insert(t.secret_hash, t);
    }
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens or the key.
        f.debug_struct("Auth")
            .field("config", &self.config)
            .finish()
    }
}

/// How often a cluster member re-reads the tokens (see [`Auth::follow_store`]).
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Auth {
    /// Where tokens are stored (durably, through the WAL) and the node's clock.
    engine: Engine,
    tokens: RwLock<Tokens>,
    /// Serializes changes, so the rights checked are the rights written.
    changes: tokio::sync::Mutex<()>,
    read_key: ReadTokenKey,
    /// Bumped after every revocation, so connections that outlive their request (SSE)
    /// can look at their credential again.
    revocations: tokio::sync::watch::Sender<u64>,
    /// `--max-streams-per-namespace`: creates admitted and in flight.
    pub quota: quota::NamespaceQuota,
    pub config: AuthConfig,
}

pub(crate) fn unauthorized(code: &'static str, message: impl Into<String>) -> ApiError {
    let challenge = if code == "unauthorized" {
        format!("Bearer realm=\"{REALM}\"")
    } else {
        format!("Bearer realm=\"{REALM}\", error=\"invalid_token\"")
    };
    ApiError::new(StatusCode::UNAUTHORIZED, code, message)
        .with_header("www-authenticate", challenge)
}

/// The caller's access token, for node-wide surfaces that take nothing else
/// (the schema registry, tables): `None` with auth off; 401 without a
/// credential; 403 for a credential that is not a token (a signed read link),
/// saying that `what` needs one.
pub fn token_of(
    auth_on: bool,
    principal: Option<&Principal>,
    what: &str,
) -> Result<Option<Arc<Token>>, ApiError> {
    if !auth_on {
        return Ok(None);
    }
    match principal {
        None => Err(Auth::missing()),
        Some(Principal::Token(t)) => Ok(Some(t.clone())),
        Some(_) => Err(forbidden(format!("{what} needs an access token"))),
    }
}

pub fn forbidden(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
}

impl Auth {
    /// Loads every token, and the signing key (created at first start).
    pub async fn open(engine: Engine, config: AuthConfig) -> Result<Auth, String> {
        let rows = engine
            .tokens()
            .await
            .map_err(|e| format!("loading tokens: {e}"))?;
        let mut tokens = Tokens::default();
        for row in &rows {
            tokens.insert(Arc::new(Token::from_record(row)?));
        }
        let key = engine
            .server_key("read-token-hmac", &credential::random_bytes::<32>())
            .await
            .map_err(|e| format!("loading the signing key: {e}"))?;
        Ok(Auth {
            engine,
            tokens: RwLock::new(tokens),
            changes: tokio::sync::Mutex::new(()),
            read_key: ReadTokenKey::new(&key),
            revocations: tokio::sync::watch::Sender::new(0),
            quota: quota::NamespaceQuota::default(),
            config,
        })
    }

    /// On a cluster member: re-reads the tokens from the shared metadata store every
    /// [`FOLLOW_EVERY`], so tokens made or revoked through other members work here
    /// too (within that delay). Runs until `shutdown`.
    pub async fn follow_store(self: Arc<Auth>, shutdown: picomq_engine::shutdown::ShutdownSignal) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_EVERY) => {}
                () = shutdown.fired() => return,
            }
            let rows = match self.engine.tokens().await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::debug!(error = %e, "re-reading tokens failed; retrying");
                    continue;
                }
            };
            let _guard = self.changes.lock().await;
            let mut revoked = false;
            let mut tokens = self.write();
            for row in &rows {
                let Ok(token) = Token::from_record(row) else {
                    continue;
                };
                let known = tokens.by_id.get(&token.id);
                if known.is_some_and(|k| k.revoked_ms.is_none() && token.revoked_ms.is_some()) {
                    revoked = true;
                }
                if known.is_none_or(|k| k.revoked_ms.is_none() || token.revoked_ms.is_some()) {
                    tokens.insert(Arc::new(token));
                }
            }
            drop(tokens);
            if revoked {
                self.revocations.send_modify(|n| *n += 1);
            }
        }
    }

    /// Sets the bootstrap admin token from `secret` (the `--bootstrap-token-file`):
    /// created at first start, its secret replaced when the file changes, but a
    /// revoked bootstrap token stays revoked.
    pub async fn bootstrap(&self, secret: &str) -> Result<(), String> {
        let secret = credential::check_secret(secret.trim())
            .map_err(|e| format!("--bootstrap-token-file: {e}"))?;
        let hash = credential::hash_secret(secret);
        let _guard = self.changes.lock().await;
        let existing = self.token(BOOTSTRAP_ID);
        if let Some(t) = &existing {
            if t.revoked_ms.is_some() {
                tracing::warn!("the bootstrap token was revoked; --bootstrap-token-file is ignored (it stays revoked)");
                return Ok(());
            }
            if t.secret_hash == hash {
                return Ok(());
            }
        }
        if let Some(other) = self.read().by_hash.get(&hash) {
            if other.id != BOOTSTRAP_ID {
                return Err(
                    "--bootstrap-token-file: that secret already belongs to another token".into(),
                );
            }
        }
        let token = Token::new(
            BOOTSTRAP_ID.into(),
            None,
            "bootstrap admin token (--bootstrap-token-file)".into(),
            vec![Scope::parse("all:**").expect("valid scope")],
            String::new(),
            existing
                .as_ref()
                .map_or_else(|| self.now_ms(), |t| t.created_ms),
            None,
            None,
            hash,
        );
        self.engine
            .put_token(token.record())
            .await
            .map_err(|e| format!("storing the bootstrap token: {e}"))?;
        self.write().insert(Arc::new(token));
        tracing::info!(
            rotated = existing.is_some(),
            "bootstrap admin token set from --bootstrap-token-file"
        );
        Ok(())
    }

    /// Now, on the node's clock.
    pub fn now_ms(&self) -> u64 {
        self.engine.clock().now_ms()
    }

    /// Whether any token could ever authenticate (else nobody can use the server).
    pub fn any_live_token(&self) -> bool {
        let now = self.now_ms();
        self.read().by_id.values().any(|t| t.is_live(now))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tokens> {
        self.tokens.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tokens> {
        self.tokens.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn token(&self, id: &str) -> Option<Arc<Token>> {
        self.read().by_id.get(id).cloned()
    }

    /// The caller of a request; `Ok(None)` when it carries no credential.
    pub fn authenticate(
        &self,
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Option<Principal>, ApiError> {
        if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
            let secret = credential::parse_bearer(value.as_bytes())
                .map_err(|e| unauthorized("invalid_token", e))?;
            // A subscription wake's own token: its handler checks it against the wake.
            if secret.starts_with(picomq_consumers::subscriptions::WAKE_TOKEN_PREFIX) {
                return Ok(None);
            }
            return self.authenticate_secret(secret).map(Some);
        }
        let Some(raw) = query
            .map(credential::query_token)
            .transpose()
            .map_err(|e| unauthorized("invalid_token", e))?
            .flatten()
        else {
            return Ok(None);
        };
        if method != Method::GET && method != Method::HEAD {
            return Err(unauthorized(
                "invalid_token",
                "a token in the query string is accepted only for reads (GET, HEAD); send writes with Authorization: Bearer",
            ));
        }
        let (expires_secs, mac) =
            ReadTokenKey::parse(raw, self.now_ms() / 1000).map_err(|e| match e {
                ReadTokenError::Expired => {
                    unauthorized("invalid_token", "the read token has expired")
                }
                _ => unauthorized(
                    "invalid_token",
                    "the token query parameter is not a valid read token",
                ),
            })?;
        Ok(Some(Principal::ReadLink { expires_secs, mac }))
    }

    /// The caller holding a token's secret (a bearer, or a Kafka SASL password).
    pub fn authenticate_secret(&self, secret: &str) -> Result<Principal, ApiError> {
        let hash = credential::hash_secret(secret);
        let token = self.read().by_hash.get(&hash).cloned();
        let token = token.ok_or_else(|| unauthorized("invalid_token", "unknown token"))?;
        if token.revoked_ms.is_some() {
            return Err(unauthorized("invalid_token", "the token was revoked"));
        }
        if token.expires_ms.is_some_and(|e| e <= self.now_ms()) {
            return Err(unauthorized("invalid_token", "the token has expired"));
        }
        Ok(Principal::Token(token))
    }

    /// 401 for a request without credentials.
    pub fn missing() -> ApiError {
        unauthorized(
            "unauthorized",
            "authentication required: send Authorization: Bearer TOKEN",
        )
    }

    /// The caller's token, if it holds `op` anywhere.
    pub fn require_op(
        &self,
        principal: Option<&Principal>,
        op: Op,
    ) -> Result<Arc<Token>, ApiError> {
        match principal {
            None => Err(Self::missing()),
            Some(Principal::Token(t)) if t.has_op(op) => Ok(t.clone()),
            Some(_) => Err(forbidden(format!(
                "this needs a token with the {} scope",
                op.name()
            ))),
        }
    }

    /// Ids of `root` and every token issued under it, transitively.
    fn descendants(&self, root: &str) -> Vec<String> {
        let tokens = self.read();
        let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
        for t in tokens.by_id.values() {
            if let Some(p) = &t.parent_id {
                children.entry(p.as_str()).or_default().push(&t.id);
            }
        }
        let mut out = vec![root.to_string()];
        let mut seen: HashSet<&str> = HashSet::from([root]);
        let mut i = 0;
        while i < out.len() {
            let id = out[i].clone();
            for c in children.get(id.as_str()).into_iter().flatten() {
                if seen.insert(c) {
                    out.push(c.to_string());
                }
            }
            i += 1;
        }
        out
    }

    pub fn read_key(&self) -> &ReadTokenKey {
        &self.read_key
    }
}

/// What a new token asks for.
pub struct TokenRequest {
    pub scopes: Vec<Scope>,
    /// Relative to the issuer's namespace.
    pub namespace: String,
    pub expires_ms: Option<u64>,
    pub description: String,
}

impl Auth {
    /// Issues a token within `issuer`'s rights; returns it and its secret (shown once).
    pub async fn issue(
        &self,
        issuer: &Token,
        req: TokenRequest,
    ) -> Result<(Arc<Token>, String), ApiError> {
        if req.scopes.is_empty() || req.scopes.len() > scope::SCOPES_MAX {
            return Err(ApiError::bad_request(format!(
                "a token needs 1 to {} scopes",
                scope::SCOPES_MAX
            )));
        }
        let namespace = format!("{}{}", issuer.namespace, req.namespace);
        for s in &req.scopes {
            let wanted = s.pattern.under(&namespace);
            for op in s.ops.iter() {
                let covered = issuer
                    .absolute
                    .iter()
                    .any(|(ops, p)| ops.has(op) && p.covers(&wanted));
                if !covered {
                    return Err(forbidden(format!(
                        "scope {s}: the issuing token does not hold {} on all of it; an issued token never gets more rights than its issuer",
                        op.name()
                    )));
                }
            }
        }
        let expires_ms = match (issuer.expires_ms, req.expires_ms) {
            (Some(limit), Some(wanted)) if wanted > limit => {
                return Err(forbidden(
                    "the requested expiry is later than the issuing token's own",
                ))
            }
            (Some(limit), None) => Some(limit),
            (_, wanted) => wanted,
        };
        let secret = credential::new_secret();
        let token = Token::new(
            credential::new_token_id(),
            Some(issuer.id.clone()),
            req.description,
            req.scopes,
            namespace,
            self.now_ms(),
            expires_ms,
            None,
            credential::hash_secret(&secret),
        );
        let _guard = self.changes.lock().await;
        // The issuer may have been revoked while this request waited.
        if self
            .token(&issuer.id)
            .is_none_or(|t| t.revoked_ms.is_some())
        {
            return Err(unauthorized("invalid_token", "the token was revoked"));
        }
        if self.read().by_id.len() >= self.config.tokens_max {
            return Err(ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "too_many_tokens",
                format!(
                    "the server holds its maximum of {} tokens",
                    self.config.tokens_max
                ),
            ));
        }
        self.engine.put_token(token.record()).await?;
        let token = Arc::new(token);
        self.write().insert(token.clone());
        Ok((token, secret))
    }

    /// Tokens `viewer` may see and revoke: itself and those issued under it.
    pub fn visible(&self, viewer: &Token) -> Vec<Arc<Token>> {
        let ids = self.descendants(&viewer.id);
        let tokens = self.read();
        let mut out: Vec<Arc<Token>> = ids
            .iter()
            .filter_map(|id| tokens.by_id.get(id).cloned())
            .collect();
        out.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        out
    }

    /// Whether a credential accepted at a request's start still holds at `now_ms`:
    /// its token not revoked since (nor any it was issued under), not expired.
    pub fn still_valid(&self, principal: &Principal, now_ms: u64) -> bool {
        match principal {
            Principal::Token(t) => self.token(&t.id).is_some_and(|t| t.is_live(now_ms)),
            Principal::ReadLink { expires_secs, .. } => expires_secs.saturating_mul(1000) > now_ms,
        }
    }

    /// When a credential expires (ms since the Unix epoch), if it does.
    pub fn expires_ms(principal: &Principal) -> Option<u64> {
        match principal {
            Principal::Token(t) => t.expires_ms,
            Principal::ReadLink { expires_secs, .. } => Some(expires_secs.saturating_mul(1000)),
        }
    }

    /// Changes after each revocation (see [`Auth::still_valid`]).
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revocations.subscribe()
    }

    /// Revokes `id` and every token issued under it, at once: the next request with
    /// any of them is refused, and SSE connections opened with them end. `Ok(false)`
    /// if `viewer` cannot see `id`.
    pub async fn revoke(&self, viewer: &Token, id: &str) -> Result<bool, ApiError> {
        let _guard = self.changes.lock().await;
        if !self.descendants(&viewer.id).iter().any(|v| v == id) {
            return Ok(false);
        }
        let ids = self.descendants(id);
        let now = self.now_ms();
        self.engine.revoke_tokens(ids.clone(), now).await?;
        let mut tokens = self.write();
        for id in &ids {
            if let Some(t) = tokens.by_id.get(id).cloned() {
                if t.revoked_ms.is_none() {
                    let mut revoked = (*t).clone();
                    revoked.revoked_ms = Some(now);
                    tokens.insert(Arc::new(revoked));
                }
            }
        }
        drop(tokens);
        self.revocations.send_modify(|n| *n += 1);
        Ok(true)
    }
}
