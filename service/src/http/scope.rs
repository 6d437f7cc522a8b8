//! Who a token speaks for: the admin token (`http.token`) sees every workspace, a workspace
//! token (`[[http.workspace_tokens]]`) only its own. The bearer layer and the browser's login
//! turn a token into a [`Scope`]; every route filters by it, and a run or rule of another
//! workspace answers 404 like one that does not exist, so ids do not leak.

use std::path::Path;

use gpusanity_db::RunFilter;
use subtle::ConstantTimeEq;

/// What a request may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Admin,
    Workspace(String),
}

impl Scope {
    /// Whether the scope sees workspace `ws`.
    pub fn sees(&self, ws: &str) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Workspace(w) => w == ws,
        }
    }

    /// The workspace a workspace token is limited to.
    pub fn workspace(&self) -> Option<&str> {
        match self {
            Scope::Admin => None,
            Scope::Workspace(w) => Some(w),
        }
    }

    /// Narrows a runs filter to the scope; false when the filter asks for another workspace
    /// (nothing to show).
    pub fn restrict(&self, f: &mut RunFilter) -> bool {
        let Some(ws) = self.workspace() else { return true };
        match &f.workspace {
            Some(asked) if asked != ws => false,
            _ => {
                f.workspace = Some(ws.to_string());
                true
            }
        }
    }
}

/// The service's tokens, each with its scope.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<(String, Scope)>,
}

/// Tokens shorter than this are refused at start-up.
pub const MIN_TOKEN_LEN: usize = 16;

impl Tokens {
    /// The admin token and (workspace, token) pairs: every token at least 16 characters, no
    /// token given twice, no empty workspace.
    pub fn new(admin: &str, workspaces: &[(String, String)]) -> Result<Tokens, String> {
        let mut entries = vec![(admin.to_string(), Scope::Admin)];
        for (ws, t) in workspaces {
            if ws.trim().is_empty() {
                return Err("http.workspace_tokens: a token without a workspace".into());
            }
            entries.push((t.clone(), Scope::Workspace(ws.clone())));
        }
        for (i, (t, s)) in entries.iter().enumerate() {
            if t.len() < MIN_TOKEN_LEN {
                return Err(match s {
                    Scope::Admin => "the API token must be at least 16 characters".into(),
                    Scope::Workspace(w) => format!("the token of workspace `{w}` must be at least 16 characters"),
                });
            }
            if entries[..i].iter().any(|(o, _)| o == t) {
                return Err("http.workspace_tokens: the same token is given twice".into());
            }
        }
        Ok(Tokens { entries })
    }

    /// The scope of `given`, compared in constant time with every token (no early exit).
    pub fn scope(&self, given: &str) -> Option<Scope> {
        let mut found = None;
        for (t, s) in &self.entries {
            if bool::from(t.as_bytes().ct_eq(given.as_bytes())) {
                found = Some(s.clone());
            }
        }
        found
    }
}

/// Whether `given` is `secret`, compared in constant time.
pub fn same_secret(secret: &str, given: &str) -> bool {
    bool::from(secret.as_bytes().ct_eq(given.as_bytes()))
}

/// A token read from a file: its first line, trimmed.
pub fn read_token_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading token file {}: {e}", path.display()))?;
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_scopes_and_short_or_repeated_ones_are_refused() {
        let t = Tokens::new("admin-token-0123456789", &[("ws-a".into(), "token-of-ws-a-0123".into())]).unwrap();
        assert_eq!(t.scope("admin-token-0123456789"), Some(Scope::Admin));
        assert_eq!(t.scope("token-of-ws-a-0123"), Some(Scope::Workspace("ws-a".into())));
        assert_eq!(t.scope("token-of-ws-a-012"), None);
        assert_eq!(t.scope(""), None);
        assert!(Tokens::new("short", &[]).is_err());
        assert!(Tokens::new("admin-token-0123456789", &[("ws".into(), "short".into())]).is_err());
        assert!(Tokens::new("admin-token-0123456789", &[("ws".into(), "admin-token-0123456789".into())]).is_err());
        assert!(Tokens::new("admin-token-0123456789", &[(" ".into(), "token-of-ws-a-0123".into())]).is_err());
    }

    #[test]
    fn a_workspace_scope_narrows_filters() {
        let ws = Scope::Workspace("a".into());
        let mut f = RunFilter::default();
        assert!(ws.restrict(&mut f));
        assert_eq!(f.workspace.as_deref(), Some("a"));
        let mut other = RunFilter { workspace: Some("b".into()), ..RunFilter::default() };
        assert!(!ws.restrict(&mut other));
        let mut any = RunFilter { workspace: Some("b".into()), ..RunFilter::default() };
        assert!(Scope::Admin.restrict(&mut any));
        assert_eq!(any.workspace.as_deref(), Some("b"));
        assert!(ws.sees("a") && !ws.sees("b") && Scope::Admin.sees("b"));
    }
}
