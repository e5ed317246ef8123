//! Approval policies: which tool calls and which connections out of the sandbox run
//! freely, wait for a person, or are refused.
//!
//! A policy is judged at two places. At *admission*, before a call runs, by what the
//! call is: its tool, its MCP server, its class. At the *effect*, when a running
//! command opens a connection through the egress proxy, by where it goes. A host rule
//! can only be judged at the effect, so a command that runs in the sandbox and may
//! reach the network is let start when some host rule could decide its connections,
//! and each connection is judged as it opens.
//!
//! A session's policy is layered: the operator's, then its named agent's, then the
//! session's own (`approve_external` is the shorthand `{"external": "ask"}`). Every
//! layer judges, and the strictest verdict stands, so no layer below can loosen what a
//! layer above asks for: the operator's rules are ceilings.
//!
//! Within one layer, the strictest of the rules that match stands (so `deny` beats
//! `ask` beats `allow` whatever their order); where none matches, an external effect
//! gets the layer's `external` verdict and any other call is allowed.

use serde::{Deserialize, Serialize};

use crate::ToolClass;

/// What a policy says of a call or a connection. Ordered from loosest to strictest.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Runs (connects) with no one asked.
    #[default]
    Allow,
    /// Waits for a person's approval first.
    Ask,
    /// Refused; the agent is told why and no one is asked.
    Deny,
}

/// One rule: a verdict for the calls (and connections) that match every condition it
/// names. A rule naming nothing matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRule {
    /// What matching calls get.
    pub verdict: Verdict,
    /// The tool's name; `*` matches any run of characters (`mcp__github__*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The MCP server whose tools it covers (by the name the session gave it).
    #[serde(default, alias = "mcp-server", skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<String>,
    /// Where a connection goes: `host`, `host:port`, `*.domain`. A rule with a host is
    /// judged at the egress proxy, connection by connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The call's effect class (`read`, `mutate`, `external`, `idempotent`). A
    /// connection is an `external` effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ToolClass>,
}

/// One layer of a session's approval policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// What an external effect no rule names gets (default `allow`).
    #[serde(default)]
    pub external: Verdict,
    /// Rules; the strictest that matches stands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<ApprovalRule>,
}

/// What a policy judges a call by.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The MCP server it belongs to, if any.
    pub mcp_server: Option<&'a str>,
    /// Its effect class (as classed, or as observed).
    pub class: ToolClass,
    /// Whether it runs in the sandbox, so its connections pass the egress proxy and are
    /// judged there.
    pub in_sandbox: bool,
}

/// The most rules one layer may hold (a policy is judged at every call and connection).
pub const MAX_RULES: usize = 64;

impl ApprovalPolicy {
    /// The shorthand `approve_external`: every external effect waits for a person.
    pub fn ask_external() -> Self {
        ApprovalPolicy {
            external: Verdict::Ask,
            rules: Vec::new(),
        }
    }

    /// Whether it says nothing (every call and connection allowed).
    pub fn is_open(&self) -> bool {
        self.external == Verdict::Allow && self.rules.iter().all(|r| r.verdict == Verdict::Allow)
    }

    /// Checks it, naming the first bad part (`rules[2].host: ...`).
    pub fn check(&self) -> Result<(), String> {
        if self.rules.len() > MAX_RULES {
            return Err(format!("rules: at most {MAX_RULES} rules"));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if let Some(host) = &rule.host {
                HostRule::parse(host).map_err(|e| format!("rules[{i}].host: {e}"))?;
            }
            for (field, value) in [("tool", &rule.tool), ("mcp_server", &rule.mcp_server)] {
                if value
                    .as_deref()
                    .is_some_and(|v| v.is_empty() || v.len() > 256)
                {
                    return Err(format!("rules[{i}].{field}: must be 1 to 256 characters"));
                }
            }
        }
        Ok(())
    }

    /// Its verdict on a call about to start. An external effect that runs in the
    /// sandbox and that some host rule of this layer could judge is let start: its
    /// connections are judged at the proxy ([`Self::judge_connection`]).
    pub fn judge_call(&self, subject: &Subject<'_>) -> Verdict {
        let matched = self
            .rules
            .iter()
            .filter(|r| r.host.is_none() && r.matches(subject, subject.class))
            .map(|r| r.verdict)
            .max();
        match matched {
            Some(verdict) => verdict,
            None if !subject.class.is_external_effect() => Verdict::Allow,
            None if subject.in_sandbox && self.rules.iter().any(|r| r.host.is_some()) => {
                Verdict::Allow
            }
            None => self.external,
        }
    }

    /// Its verdict on a connection to `destination` (`host:port`) that a call opens.
    pub fn judge_connection(&self, subject: &Subject<'_>, destination: &str) -> Verdict {
        let (host, port) = split_destination(destination);
        self.rules
            .iter()
            .filter(|r| {
                r.matches(subject, ToolClass::External)
                    && r.host.as_deref().is_none_or(|h| {
                        HostRule::parse(h).is_ok_and(|rule| rule.allows(host, port))
                    })
            })
            .map(|r| r.verdict)
            .max()
            .unwrap_or(self.external)
    }
}

/// The strictest verdict of every layer on a call about to start.
pub fn judge_call(layers: &[ApprovalPolicy], subject: &Subject<'_>) -> Verdict {
    layers
        .iter()
        .map(|l| l.judge_call(subject))
        .max()
        .unwrap_or_default()
}

/// The strictest verdict of every layer on a connection a call opens.
pub fn judge_connection(
    layers: &[ApprovalPolicy],
    subject: &Subject<'_>,
    destination: &str,
) -> Verdict {
    layers
        .iter()
        .map(|l| l.judge_connection(subject, destination))
        .max()
        .unwrap_or_default()
}

impl ApprovalRule {
    /// Whether its tool, server and class conditions hold for `subject` taken as
    /// `class`.
    fn matches(&self, subject: &Subject<'_>, class: ToolClass) -> bool {
        self.tool
            .as_deref()
            .is_none_or(|pattern| glob_matches(pattern, subject.tool))
            && self
                .mcp_server
                .as_deref()
                .is_none_or(|server| subject.mcp_server == Some(server))
            && self.class.is_none_or(|c| c == class)
    }
}

/// `host:port` split (a destination without a port is taken as port 443).
fn split_destination(destination: &str) -> (&str, u16) {
    match destination.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().unwrap_or(443)),
        None => (destination, 443),
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One destination: a host name (`api.example.com`), a domain and its subdomains
/// (`*.example.com`), optionally with a port (`localhost:8080`). Network allow-lists
/// and approval rules name hosts this way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRule {
    /// The host, lowercase; a leading `*.` matches any subdomain.
    pub host: String,
    /// The port, if only one is meant.
    pub port: Option<u16>,
}

impl std::fmt::Display for HostRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

impl HostRule {
    /// Parses `host`, `host:port`, `*.domain` or `*.domain:port`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| format!("`{text}`: the port must be a number"))?,
                ),
            ),
            None => (text, None),
        };
        let bare = host.strip_prefix("*.").unwrap_or(host);
        if bare.is_empty()
            || !bare
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        {
            return Err(format!("`{text}` is not a host name"));
        }
        Ok(HostRule {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// Whether a connection to `host:port` matches this rule.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let host_ok = match self.host.strip_prefix("*.") {
            Some(domain) => host.ends_with(&format!(".{domain}")),
            None => host == self.host,
        };
        host_ok && self.port.is_none_or(|p| p == port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bash() -> Subject<'static> {
        Subject {
            tool: "bash",
            mcp_server: None,
            class: ToolClass::External,
            in_sandbox: true,
        }
    }

    fn rule(verdict: Verdict) -> ApprovalRule {
        ApprovalRule {
            verdict,
            tool: None,
            mcp_server: None,
            host: None,
            class: None,
        }
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_matches("bash", "bash"));
        assert!(!glob_matches("bash", "bashful"));
        assert!(glob_matches("mcp__github__*", "mcp__github__create_issue"));
        assert!(!glob_matches("mcp__github__*", "mcp__gitlab__x"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("a*b*c", "axxbyyc"));
        assert!(!glob_matches("a*b*c", "axxbyy"));
        assert!(!glob_matches("ab*ba", "aba"));
    }

    #[test]
    fn the_strictest_matching_rule_stands_within_a_layer() {
        let policy = ApprovalPolicy {
            external: Verdict::Allow,
            rules: vec![
                ApprovalRule {
                    host: Some("*.evil.test".into()),
                    ..rule(Verdict::Deny)
                },
                ApprovalRule {
                    host: Some("api.evil.test".into()),
                    ..rule(Verdict::Allow)
                },
                ApprovalRule {
                    host: Some("pay.example.com:443".into()),
                    ..rule(Verdict::Ask)
                },
            ],
        };
        assert_eq!(
            policy.judge_connection(&bash(), "api.evil.test:443"),
            Verdict::Deny
        );
        assert_eq!(
            policy.judge_connection(&bash(), "pay.example.com:443"),
            Verdict::Ask
        );
        assert_eq!(
            policy.judge_connection(&bash(), "pay.example.com:80"),
            Verdict::Allow
        );
        // A host rule is judged at the proxy: the command starts.
        assert_eq!(policy.judge_call(&bash()), Verdict::Allow);
    }

    #[test]
    fn an_external_effect_no_rule_names_gets_the_layers_default() {
        let ask = ApprovalPolicy::ask_external();
        assert_eq!(ask.judge_call(&bash()), Verdict::Ask);
        assert_eq!(ask.judge_connection(&bash(), "x.test:443"), Verdict::Ask);
        let read = Subject {
            class: ToolClass::Read,
            ..bash()
        };
        assert_eq!(ask.judge_call(&read), Verdict::Allow);
        // Where host rules decide, the command starts and its connections are judged.
        let with_hosts = ApprovalPolicy {
            rules: vec![ApprovalRule {
                host: Some("pypi.org".into()),
                ..rule(Verdict::Allow)
            }],
            ..ApprovalPolicy::ask_external()
        };
        assert_eq!(with_hosts.judge_call(&bash()), Verdict::Allow);
        assert_eq!(
            with_hosts.judge_connection(&bash(), "pypi.org:443"),
            Verdict::Allow
        );
        assert_eq!(
            with_hosts.judge_connection(&bash(), "example.com:443"),
            Verdict::Ask
        );
        // An MCP tool runs elsewhere: judged before it runs.
        let mcp = Subject {
            tool: "tracker__close",
            mcp_server: Some("tracker"),
            in_sandbox: false,
            ..bash()
        };
        assert_eq!(with_hosts.judge_call(&mcp), Verdict::Ask);
    }

    #[test]
    fn rules_name_tools_servers_and_classes() {
        let policy = ApprovalPolicy {
            external: Verdict::Allow,
            rules: vec![
                ApprovalRule {
                    mcp_server: Some("tracker".into()),
                    ..rule(Verdict::Ask)
                },
                ApprovalRule {
                    tool: Some("edit".into()),
                    ..rule(Verdict::Deny)
                },
                ApprovalRule {
                    class: Some(ToolClass::Mutate),
                    ..rule(Verdict::Ask)
                },
            ],
        };
        let tracker = Subject {
            tool: "tracker__close",
            mcp_server: Some("tracker"),
            class: ToolClass::External,
            in_sandbox: false,
        };
        assert_eq!(policy.judge_call(&tracker), Verdict::Ask);
        let edit = Subject {
            tool: "edit",
            mcp_server: None,
            class: ToolClass::Mutate,
            in_sandbox: true,
        };
        assert_eq!(policy.judge_call(&edit), Verdict::Deny);
        let write = Subject {
            tool: "write",
            ..edit
        };
        assert_eq!(policy.judge_call(&write), Verdict::Ask);
        assert_eq!(policy.judge_call(&bash()), Verdict::Allow);
    }

    #[test]
    fn no_lower_layer_loosens_an_upper_one() {
        let operator = ApprovalPolicy {
            external: Verdict::Allow,
            rules: vec![ApprovalRule {
                host: Some("*.internal.test".into()),
                ..rule(Verdict::Deny)
            }],
        };
        let session = ApprovalPolicy {
            external: Verdict::Allow,
            rules: vec![ApprovalRule {
                host: Some("db.internal.test".into()),
                ..rule(Verdict::Allow)
            }],
        };
        let layers = [operator, session];
        assert_eq!(
            judge_connection(&layers, &bash(), "db.internal.test:5432"),
            Verdict::Deny
        );
        assert_eq!(
            judge_connection(&layers, &bash(), "example.com:443"),
            Verdict::Allow
        );
        let stricter = [ApprovalPolicy::default(), ApprovalPolicy::ask_external()];
        assert_eq!(judge_call(&stricter, &bash()), Verdict::Ask);
        assert_eq!(judge_call(&[], &bash()), Verdict::Allow);
    }

    #[test]
    fn a_bad_rule_is_named() {
        let policy = ApprovalPolicy {
            external: Verdict::Ask,
            rules: vec![
                rule(Verdict::Allow),
                ApprovalRule {
                    host: Some("not a host".into()),
                    ..rule(Verdict::Allow)
                },
            ],
        };
        let err = policy.check().unwrap_err();
        assert!(err.starts_with("rules[1].host:"), "{err}");
        let empty_tool = ApprovalPolicy {
            rules: vec![ApprovalRule {
                tool: Some(String::new()),
                ..rule(Verdict::Ask)
            }],
            ..ApprovalPolicy::default()
        };
        assert!(empty_tool.check().unwrap_err().starts_with("rules[0].tool"));
    }
}
