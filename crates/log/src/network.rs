//! Where a session's sandbox may connect: parsed once, where it enters (the API, the
//! configuration), and kept parsed. The log stores it in its text form, the one a
//! person writes (`deny-all`, `open`, `allow:host[:port],*.example.com`), so logs read
//! the same as before it had a type.

use serde::{Deserialize, Serialize};

use crate::approval::HostRule;

/// Where a sandbox's commands may connect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum NetworkPolicy {
    /// No network at all: a private network namespace with only loopback (the default).
    #[default]
    DenyAll,
    /// Only these hosts, over HTTP(S) through an egress proxy the harness runs outside
    /// the sandbox; the sandbox can reach the proxy and nothing else.
    AllowList(Vec<HostRule>),
    /// The host's network, asked for by name.
    Open,
}

impl NetworkPolicy {
    /// Parses `deny-all`, `open` or `allow:host[:port],*.example.com,...`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "deny-all" | "none" => Ok(NetworkPolicy::DenyAll),
            "open" => Ok(NetworkPolicy::Open),
            other => match other.strip_prefix("allow:") {
                Some(list) => {
                    let rules = list
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(HostRule::parse)
                        .collect::<Result<Vec<_>, _>>()?;
                    if rules.is_empty() {
                        return Err("allow: needs at least one host".into());
                    }
                    Ok(NetworkPolicy::AllowList(rules))
                }
                None => Err(format!(
                    "network policy `{other}`: expected deny-all, open or allow:host1,host2"
                )),
            },
        }
    }
}

impl std::fmt::Display for NetworkPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetworkPolicy::DenyAll => f.write_str("deny-all"),
            NetworkPolicy::Open => f.write_str("open"),
            NetworkPolicy::AllowList(rules) => {
                f.write_str("allow:")?;
                for (i, rule) in rules.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{rule}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::str::FromStr for NetworkPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        NetworkPolicy::parse(text)
    }
}

impl TryFrom<String> for NetworkPolicy {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        NetworkPolicy::parse(&text)
    }
}

impl From<NetworkPolicy> for String {
    fn from(policy: NetworkPolicy) -> String {
        policy.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_rules_match_by_name_and_port() {
        assert_eq!(NetworkPolicy::parse("deny-all"), Ok(NetworkPolicy::DenyAll));
        assert_eq!(NetworkPolicy::parse("open"), Ok(NetworkPolicy::Open));
        let NetworkPolicy::AllowList(rules) =
            NetworkPolicy::parse("allow:localhost:8080, *.example.com").unwrap()
        else {
            panic!()
        };
        assert!(rules[0].allows("LOCALHOST", 8080));
        assert!(!rules[0].allows("localhost", 8081));
        assert!(!rules[0].allows("127.0.0.1", 8080));
        assert!(rules[1].allows("api.example.com", 443));
        assert!(!rules[1].allows("example.com.evil", 443));
        assert!(!rules[1].allows("notexample.com", 443));
        assert!(NetworkPolicy::parse("allow:").is_err());
        assert!(NetworkPolicy::parse("allow:bad host").is_err());
        assert!(NetworkPolicy::parse("allow:h:99999").is_err());
        assert!(NetworkPolicy::parse("everything").is_err());
    }

    #[test]
    fn the_log_keeps_the_text_a_person_writes() {
        for text in ["deny-all", "open", "allow:localhost:8080,*.example.com"] {
            let policy = NetworkPolicy::parse(text).unwrap();
            assert_eq!(policy.to_string(), text);
            let json = serde_json::to_value(&policy).unwrap();
            assert_eq!(json, serde_json::json!(text));
            assert_eq!(
                serde_json::from_value::<NetworkPolicy>(json).unwrap(),
                policy
            );
        }
        assert_eq!(
            NetworkPolicy::parse("none").unwrap().to_string(),
            "deny-all"
        );
        let bad = serde_json::from_value::<NetworkPolicy>(serde_json::json!("allow:bad host"));
        assert!(bad.unwrap_err().to_string().contains("not a host name"));
    }
}
