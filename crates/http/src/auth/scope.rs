//! What a token may do: operations on stream-name patterns. Parsing of the text form
//! (`read,append:orders/**`), matching a name, and the containment check that keeps
//! an issued token within the rights of the token that issued it.

use std::fmt;

/// Longest pattern of a scope, in bytes.
pub const PATTERN_BYTES_MAX: usize = 256;
/// Most scopes one token carries.
pub const SCOPES_MAX: usize = 32;

/// One operation, as a bit of `Ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    Create = 1,
    Append = 2,
    Read = 4,
    Delete = 8,
    /// Metrics and other node-wide admin endpoints.
    Admin = 16,
    /// Issue, list and revoke tokens (within the issuer's own rights).
    Tokens = 32,
    /// Create, read and delete Durable Streams subscriptions and their stream links
    /// (on the subscription's path, `{root}__ds/subscriptions/ID`).
    Subscribe = 64,
    /// Claim a pull-wake subscription's wake (ack and release take the claim's own
    /// token).
    Claim = 128,
    /// Register, delete and configure schemas in the registry (on subjects the
    /// pattern matches: `schemas:orders-*`).
    Schemas = 256,
    /// Define and drop Iceberg tables fed by the streams the pattern matches
    /// (with read on them too: a table exports what it is fed).
    Tables = 512,
}

impl Op {
    pub const ALL: [Op; 10] = [
        Op::Create,
        Op::Append,
        Op::Read,
        Op::Delete,
        Op::Admin,
        Op::Tokens,
        Op::Subscribe,
        Op::Claim,
        Op::Schemas,
        Op::Tables,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Append => "append",
            Op::Read => "read",
            Op::Delete => "delete",
            Op::Admin => "admin",
            Op::Tokens => "tokens",
            Op::Subscribe => "subscribe",
            Op::Claim => "claim",
            Op::Schemas => "schemas",
            Op::Tables => "tables",
        }
    }
}

/// A set of operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ops(u16);

impl Ops {
    pub fn all() -> Ops {
        Ops(1023)
    }
    pub fn has(self, op: Op) -> bool {
        self.0 & op as u16 != 0
    }
    fn with(self, op: Op) -> Ops {
        Ops(self.0 | op as u16)
    }
    pub fn iter(self) -> impl Iterator<Item = Op> {
        Op::ALL.into_iter().filter(move |op| self.has(*op))
    }
}

/// A stream-name pattern. Names are matched in the form the server stores them: the
/// URL path without its leading `/`, percent-escapes as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// No wildcard: this one name.
    Exact(String),
    /// A trailing `**` and no other wildcard: every name starting with the text.
    Prefix(String),
    /// `*` (any run within one `/` segment), `**` (any run), `?` (one byte, not `/`);
    /// `\` escapes the next character.
    Glob(Vec<Tok>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    Lit(u8),
    One,
    Star,
    DoubleStar,
}

impl Pattern {
    pub fn parse(raw: &str) -> Result<Pattern, String> {
        // A leading `/` means what it means in a stream's path: names are stored
        // without it (`/logs/*` and `logs/*` are one pattern).
        let raw = raw.strip_prefix('/').unwrap_or(raw);
        if raw.is_empty() {
            return Err("a scope's pattern is empty (use ** for every stream)".into());
        }
        if raw.len() > PATTERN_BYTES_MAX {
            return Err(format!(
                "a scope's pattern is {} bytes; the limit is {PATTERN_BYTES_MAX}",
                raw.len()
            ));
        }
        if raw.chars().any(|c| c.is_control() || c == ' ') {
            return Err("a scope's pattern must not contain spaces or control characters".into());
        }
        let mut toks = Vec::with_capacity(raw.len());
        let bytes = raw.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => {
                    let next = *bytes
                        .get(i + 1)
                        .ok_or("a scope's pattern ends with a lone \\")?;
                    toks.push(Tok::Lit(next));
                    i += 2;
                }
                b'*' if bytes.get(i + 1) == Some(&b'*') => {
                    toks.push(Tok::DoubleStar);
                    i += 2;
                }
                b'*' => {
                    toks.push(Tok::Star);
                    i += 1;
                }
                b'?' => {
                    toks.push(Tok::One);
                    i += 1;
                }
                b => {
                    toks.push(Tok::Lit(b));
                    i += 1;
                }
            }
        }
        Ok(Pattern::from_toks(toks))
    }

    /// The pattern of these tokens (exact, prefix or glob, whichever it is).
    pub fn from_toks(toks: Vec<Tok>) -> Pattern {
        let wild = toks.iter().filter(|t| !matches!(t, Tok::Lit(_))).count();
        let literal = |toks: &[Tok]| {
            let bytes: Vec<u8> = toks
                .iter()
                .map(|t| match t {
                    Tok::Lit(b) => *b,
                    _ => unreachable!("only literals"),
                })
                .collect();
            // Escapes only ever split ASCII, so the bytes stay UTF-8.
            String::from_utf8_lossy(&bytes).into_owned()
        };
        match toks.last() {
            _ if wild == 0 => Pattern::Exact(literal(&toks)),
            Some(Tok::DoubleStar) if wild == 1 => Pattern::Prefix(literal(&toks[..toks.len() - 1])),
            _ => Pattern::Glob(toks),
        }
    }

    /// This pattern under `namespace` (a literal without wildcards).
    pub fn under(&self, namespace: &str) -> Pattern {
        if namespace.is_empty() {
            return self.clone();
        }
        match self {
            Pattern::Exact(s) => Pattern::Exact(format!("{namespace}{s}")),
            Pattern::Prefix(s) => Pattern::Prefix(format!("{namespace}{s}")),
            Pattern::Glob(toks) => {
                let mut all: Vec<Tok> = namespace.bytes().map(Tok::Lit).collect();
                all.extend(toks.iter().cloned());
                Pattern::Glob(all)
            }
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Exact(s) => s == name,
            Pattern::Prefix(p) => name.starts_with(p.as_str()),
            Pattern::Glob(toks) => glob_matches(toks, name.as_bytes()),
        }
    }

    /// The literal text every matching name starts with.
    fn literal_prefix(&self) -> Vec<u8> {
        match self {
            Pattern::Exact(s) | Pattern::Prefix(s) => s.as_bytes().to_vec(),
            Pattern::Glob(toks) => toks
                .iter()
                .map_while(|t| match t {
                    Tok::Lit(b) => Some(*b),
                    _ => None,
                })
                .collect(),
        }
    }

    /// Every name `other` matches, this matches too. Conservative for globs: a glob
    /// covers exact names it matches and itself, nothing else.
    pub fn covers(&self, other: &Pattern) -> bool {
        match (self, other) {
            (Pattern::Exact(a), Pattern::Exact(b)) => a == b,
            (Pattern::Exact(_), _) => false,
            (Pattern::Prefix(p), o) => o.literal_prefix().starts_with(p.as_bytes()),
            (Pattern::Glob(_), Pattern::Exact(b)) => self.matches(b),
            (Pattern::Glob(a), Pattern::Glob(b)) => a == b,
            (Pattern::Glob(_), Pattern::Prefix(_)) => false,
        }
    }
}

/// `toks` against `name` by dynamic programming over name positions: O(len(toks) *
/// len(name)) time, with both bounded by the pattern and stream-name limits.
fn glob_matches(toks: &[Tok], name: &[u8]) -> bool {
    let n = name.len();
    let mut cur = vec![false; n + 1];
    let mut next = vec![false; n + 1];
    cur[0] = true;
    for tok in toks {
        match tok {
            Tok::Lit(b) => {
                next[0] = false;
                for j in 1..=n {
                    next[j] = cur[j - 1] && name[j - 1] == *b;
                }
            }
            Tok::One => {
                next[0] = false;
                for j in 1..=n {
                    next[j] = cur[j - 1] && name[j - 1] != b'/';
                }
            }
            Tok::Star => {
                next[0] = cur[0];
                for j in 1..=n {
                    next[j] = cur[j] || (next[j - 1] && name[j - 1] != b'/');
                }
            }
            Tok::DoubleStar => {
                next[0] = cur[0];
                for j in 1..=n {
                    next[j] = cur[j] || next[j - 1];
                }
            }
        }
        std::mem::swap(&mut cur, &mut next);
        if !cur.iter().any(|m| *m) {
            return false;
        }
    }
    cur[n]
}

/// Operations on a pattern: one scope of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub ops: Ops,
    pub pattern: Pattern,
    /// The text it was parsed from, for listing.
    pub text: String,
}

impl Scope {
    /// `OPS:PATTERN`, OPS a comma-separated list of create, append, read, delete,
    /// admin, tokens, subscribe, claim, schemas, tables, or `all`. `PATTERN` defaults to `**` when
    /// `:PATTERN` is left out.
    pub fn parse(text: &str) -> Result<Scope, String> {
        let text = text.trim();
        let (ops_text, pattern_text) = text.split_once(':').unwrap_or((text, "**"));
        let mut ops = Ops::default();
        for word in ops_text.split(',').map(str::trim) {
            ops = match word {
                "all" | "*" => Ops::all(),
                w => {
                    let op = Op::ALL.into_iter().find(|op| op.name() == w).ok_or_else(|| {
                        format!(
                            "scope {text:?}: unknown operation {w:?} (use create, append, read, delete, admin, tokens, subscribe, claim, schemas, tables or all)"
                        )
                    })?;
                    ops.with(op)
                }
            };
        }
        let pattern = Pattern::parse(pattern_text).map_err(|e| format!("scope {text:?}: {e}"))?;
        // Shown as it matches: without the leading `/` a stream path has.
        let shown = pattern_text.strip_prefix('/').unwrap_or(pattern_text);
        Ok(Scope {
            ops,
            pattern,
            text: format!("{}:{shown}", ops_names(ops)),
        })
    }
}

fn ops_names(ops: Ops) -> String {
    if ops == Ops::all() {
        return "all".into();
    }
    ops.iter().map(Op::name).collect::<Vec<_>>().join(",")
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A namespace: empty, or literal text ending in `/` (so `a/` never covers `ab/`).
pub fn parse_namespace(ns: &str) -> Result<String, String> {
    if ns.is_empty() {
        return Ok(String::new());
    }
    if ns.len() > PATTERN_BYTES_MAX {
        return Err(format!(
            "namespace is {} bytes; the limit is {PATTERN_BYTES_MAX}",
            ns.len()
        ));
    }
    let ns = ns.strip_prefix('/').unwrap_or(ns);
    if !ns.ends_with('/') || ns.starts_with('/') || ns.contains("//") {
        return Err("namespace must look like `tenant/` (segments ending with /)".into());
    }
    if ns.chars().any(|c| c.is_control() || " *?\\".contains(c))
        || ns
            .split('/')
            .any(|s| s == "." || s == ".." || s.starts_with("__"))
    {
        return Err(
            "namespace must not contain spaces, control characters, * ? \\, . or .. segments, or segments starting with __".into(),
        );
    }
    Ok(ns.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse(s).unwrap()
    }

    #[test]
    fn pattern_kinds() {
        assert_eq!(p("a/b"), Pattern::Exact("a/b".into()));
        assert_eq!(p("a/**"), Pattern::Prefix("a/".into()));
        assert_eq!(p("**"), Pattern::Prefix("".into()));
        assert_eq!(p("a\\*"), Pattern::Exact("a*".into()));
        assert!(matches!(p("a/*"), Pattern::Glob(_)));
        assert!(matches!(p("a/**/x"), Pattern::Glob(_)));
        for bad in ["", "/", "a b", "a\\", &"x".repeat(257)] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_leading_slash_is_the_one_a_stream_path_has() {
        assert_eq!(p("/logs/*"), p("logs/*"));
        assert_eq!(p("/logs/a"), Pattern::Exact("logs/a".into()));
        assert_eq!(p("/**"), Pattern::Prefix("".into()));
        assert!(p("/logs/*").matches("logs/a"));
        let scope = Scope::parse("read:/logs/*").unwrap();
        assert!(scope.ops.has(Op::Read) && scope.pattern.matches("logs/a"));
        assert_eq!(scope.to_string(), "read:logs/*");
    }

    #[test]
    fn matching() {
        assert!(p("a/b").matches("a/b"));
        assert!(!p("a/b").matches("a/bc"));
        assert!(p("a/**").matches("a/b/c"));
        assert!(!p("a/**").matches("ab"));
        assert!(p("a/*").matches("a/b"));
        assert!(!p("a/*").matches("a/b/c"));
        assert!(p("a/*/c").matches("a/xyz/c"));
        assert!(p("a/**/c").matches("a/x/y/c"));
        assert!(!p("a/**/c").matches("a/x/y/d"));
        assert!(p("a/?").matches("a/b"));
        assert!(!p("a/?").matches("a//"));
        assert!(p("*").matches(""));
        assert!(p("x*y*z").matches("xaybz"));
        assert!(!p("x*y*z").matches("xaybzq"));
    }

    #[test]
    fn containment_is_never_wider() {
        assert!(p("a/**").covers(&p("a/b")));
        assert!(p("a/**").covers(&p("a/b/**")));
        assert!(p("a/**").covers(&p("a/*/c")));
        assert!(!p("a/**").covers(&p("*/c")));
        assert!(!p("a/b").covers(&p("a/**")));
        assert!(p("a/*").covers(&p("a/x")));
        assert!(!p("a/*").covers(&p("a/**")));
        assert!(p("a/*").covers(&p("a/*")));
        assert!(!p("a/*").covers(&p("a/x*")));
        assert!(p("**").covers(&p("anything/*")));
    }

    #[test]
    fn namespaces_prefix_patterns() {
        assert!(p("x/*").under("t/").matches("t/x/1"));
        assert!(!p("x/*").under("t/").matches("x/1"));
        assert_eq!(p("**").under("t/"), Pattern::Prefix("t/".into()));
        assert!(parse_namespace("t/").is_ok());
        assert_eq!(parse_namespace("/t/u/").unwrap(), "t/u/");
        for bad in ["t", "t//", "*/", "../", "__x/", "a b/"] {
            assert!(parse_namespace(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scopes_parse() {
        let s = Scope::parse("read,append:orders/**").unwrap();
        assert!(s.ops.has(Op::Read) && s.ops.has(Op::Append) && !s.ops.has(Op::Delete));
        assert_eq!(s.text, "append,read:orders/**");
        assert_eq!(Scope::parse("all").unwrap().ops, Ops::all());
        assert_eq!(Scope::parse("all").unwrap().text, "all:**");
        assert!(Scope::parse("write:x").is_err());
        assert!(Scope::parse(":x").is_err());
    }
}
