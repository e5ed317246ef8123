//! Finding sessions among many: a page of one owner's sessions, filtered by status,
//! agent, labels, time and title, newest first, with a cursor for the next page; and
//! what a session is called and tagged with (title, labels, metadata), set at
//! creation and changed later.
//!
//! Every store answers a [`SessionQuery`] from an index on `(owner, created_at_ms,
//! id)`, so a page costs what it returns, not what the world holds. The filters are
//! built once here, as SQL both stores speak; each store says only how it spells a
//! placeholder, a label test and a title search ([`Dialect`]).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The most sessions one page holds.
pub const MAX_PAGE: usize = 1000;
/// How many labels a session may carry.
pub const MAX_LABELS: usize = 32;
/// How many metadata entries a session may carry.
pub const MAX_METADATA: usize = 50;
/// The longest label key or value, in bytes.
pub const MAX_LABEL_LEN: usize = 63;
/// The longest metadata key, in bytes.
pub const MAX_METADATA_KEY: usize = 64;
/// The longest metadata value, in bytes.
pub const MAX_METADATA_VALUE: usize = 512;
/// The longest title, in characters.
pub const MAX_TITLE: usize = 200;

/// Which sessions to list. Every field narrows; the default lists every session of
/// every owner (what `gc` and the local CLI need).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionQuery {
    /// Only this owner's.
    pub owner: Option<String>,
    /// Only these statuses (as listed: `idle`, `running`, `retrying`, ...); any if empty.
    pub statuses: Vec<steadfast_log::Status>,
    /// Only sessions of this agent (as `session_started` names it).
    pub agent: Option<String>,
    /// Only sessions carrying every one of these labels with these values.
    pub labels: BTreeMap<String, String>,
    /// Created at or after, ms since the Unix epoch.
    pub created_after: Option<u64>,
    /// Created before, ms since the Unix epoch.
    pub created_before: Option<u64>,
    /// Last changed at or after, ms since the Unix epoch.
    pub updated_after: Option<u64>,
    /// Last changed before, ms since the Unix epoch.
    pub updated_before: Option<u64>,
    /// Only titles containing this text, ignoring case.
    pub title: Option<String>,
    /// Only sessions after this one in the listing's order (the previous page's
    /// [`SessionPage::next`]).
    pub after: Option<Cursor>,
    /// At most this many (all if `None`).
    pub limit: Option<usize>,
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionPage {
    /// Newest first.
    pub sessions: Vec<crate::SessionSummary>,
    /// Where the next page starts, if there may be one.
    pub next: Option<Cursor>,
}

/// A place in the listing's order (newest first): the last session a page returned.
/// Stable while sessions are created and deleted, unlike an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// That session's creation time.
    pub created_at_ms: u64,
    /// That session's id (orders sessions created in the same millisecond).
    pub id: String,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_at_ms, self.id)
    }
}

impl FromStr for Cursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{}` is not a cursor this server gave", s.escape_debug());
        let (at, id) = s.split_once('.').ok_or_else(bad)?;
        let created_at_ms = at.parse().map_err(|_| bad())?;
        if id.is_empty()
            || id.len() > 128
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(bad());
        }
        Ok(Cursor {
            created_at_ms,
            id: id.to_string(),
        })
    }
}

/// A change to what a session is called and tagged with. Labels and metadata are
/// merged key by key: a value sets its key, `None` removes it, keys not named stay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionPatch {
    /// A new title (kept over the first message, which titles a session otherwise).
    pub title: Option<String>,
    /// Labels to set (`Some`) or remove (`None`); what listings filter on.
    pub labels: BTreeMap<String, Option<String>>,
    /// Metadata to set or remove: the caller's own notes, returned, never filtered on.
    pub metadata: BTreeMap<String, Option<String>>,
}

impl SessionPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.title.is_none() && self.labels.is_empty() && self.metadata.is_empty()
    }

    /// Checks each entry on its own; the message names the field.
    pub fn check(&self) -> Result<(), String> {
        if self.labels.len() > MAX_LABELS {
            return Err(format!("labels: at most {MAX_LABELS}"));
        }
        if self.metadata.len() > MAX_METADATA {
            return Err(format!("metadata: at most {MAX_METADATA} entries"));
        }
        if let Some(title) = &self.title {
            check_title(title)?;
        }
        for (key, value) in &self.labels {
            check_label("labels", key, value.as_deref())?;
        }
        for (key, value) in &self.metadata {
            if key.is_empty() || key.len() > MAX_METADATA_KEY || key.chars().any(char::is_control) {
                return Err(format!(
                    "metadata: a key must be 1 to {MAX_METADATA_KEY} bytes without control characters, not `{}`",
                    key.escape_debug()
                ));
            }
            if value.as_ref().is_some_and(|v| v.len() > MAX_METADATA_VALUE) {
                return Err(format!(
                    "metadata.{key}: a value is at most {MAX_METADATA_VALUE} bytes"
                ));
            }
        }
        Ok(())
    }

    /// The labels and metadata after this patch, or which bound it breaks.
    pub(crate) fn merged(&self, labels: &str, metadata: &str) -> crate::Result<(String, String)> {
        let labels = merge(labels, &self.labels, MAX_LABELS, "labels")?;
        let metadata = merge(metadata, &self.metadata, MAX_METADATA, "metadata")?;
        Ok((labels, metadata))
    }
}

/// A stored map with changes merged in, stored again.
fn merge(
    stored: &str,
    changes: &BTreeMap<String, Option<String>>,
    most: usize,
    field: &str,
) -> crate::Result<String> {
    let mut map = parse_map(stored);
    for (key, value) in changes {
        match value {
            Some(v) => map.insert(key.clone(), v.clone()),
            None => map.remove(key),
        };
    }
    if map.len() > most {
        return Err(crate::Error::Invalid(format!(
            "{field}: a session carries at most {most}, this would make {}",
            map.len()
        )));
    }
    Ok(serde_json::to_string(&map).unwrap_or_else(|_| "{}".into()))
}

/// A stored JSON map of strings (an empty one if it is not one).
pub(crate) fn parse_map(stored: &str) -> BTreeMap<String, String> {
    serde_json::from_str(stored).unwrap_or_default()
}

/// A title: not blank, at most [`MAX_TITLE`] characters, no control characters.
pub fn check_title(title: &str) -> Result<(), String> {
    if title.trim().is_empty() {
        return Err("title: must not be blank".into());
    }
    if title.chars().count() > MAX_TITLE || title.chars().any(char::is_control) {
        return Err(format!(
            "title: at most {MAX_TITLE} characters, without control characters"
        ));
    }
    Ok(())
}

/// A label as listings filter on it: a key of letters, digits and `._/-` starting
/// with a letter or digit, a value of letters, digits and `._-`, each at most
/// [`MAX_LABEL_LEN`] bytes (so a filter `key=value,key=value` reads unambiguously).
pub fn check_label(field: &str, key: &str, value: Option<&str>) -> Result<(), String> {
    let key_ok = !key.is_empty()
        && key.len() <= MAX_LABEL_LEN
        && key.starts_with(|c: char| c.is_ascii_alphanumeric())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'));
    if !key_ok {
        return Err(format!(
            "{field}: `{}` is not a label key (1 to {MAX_LABEL_LEN} letters, digits or `._/-`, starting with a letter or digit)",
            key.escape_debug()
        ));
    }
    if let Some(value) = value {
        if value.len() > MAX_LABEL_LEN
            || !value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(format!(
                "{field}.{key}: `{}` is not a label value (at most {MAX_LABEL_LEN} letters, digits or `._-`)",
                value.escape_debug()
            ));
        }
    }
    Ok(())
}

/// Reads a label filter `key=value,key=value`.
pub fn parse_label_filter(field: &str, text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{field}: `{}` is not `key=value`", pair.escape_debug()))?;
        check_label(field, key, Some(value))?;
        labels.insert(key.to_string(), value.to_string());
    }
    Ok(labels)
}

/// A value a listing's SQL is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param {
    Text(String),
    Int(i64),
}

/// How a store spells what the listing's SQL needs.
pub(crate) struct Dialect {
    /// The listed status (a session with a retry due shows as `retrying`).
    pub status: &'static str,
    /// When the session last changed.
    pub updated: &'static str,
    /// The `n`-th placeholder (1-based).
    pub placeholder: fn(usize) -> String,
    /// A test that label key (placeholder) has value (placeholder).
    pub label: fn(&str, &str) -> String,
    /// A test that the title contains the text (placeholder), ignoring case.
    pub title: fn(&str) -> String,
}

impl SessionQuery {
    /// The `WHERE ... ORDER BY ... LIMIT` that answers this query, and its values.
    /// It asks for one row more than a page, to know whether another follows.
    pub(crate) fn sql(&self, d: &Dialect) -> (String, Vec<Param>) {
        let mut params = Vec::new();
        let mut bind = |p: Param| {
            params.push(p);
            (d.placeholder)(params.len())
        };
        let mut conds: Vec<String> = Vec::new();
        if let Some(owner) = &self.owner {
            conds.push(format!("owner = {}", bind(Param::Text(owner.clone()))));
        }
        if !self.statuses.is_empty() {
            let list: Vec<String> = self
                .statuses
                .iter()
                .map(|s| bind(Param::Text(s.as_str().to_string())))
                .collect();
            conds.push(format!("{} IN ({})", d.status, list.join(", ")));
        }
        if let Some(agent) = &self.agent {
            conds.push(format!("agent = {}", bind(Param::Text(agent.clone()))));
        }
        for (key, value) in &self.labels {
            let k = bind(Param::Text(key.clone()));
            let v = bind(Param::Text(value.clone()));
            conds.push((d.label)(&k, &v));
        }
        let at = |ms: u64| Param::Int(ms.min(i64::MAX as u64) as i64);
        if let Some(ms) = self.created_after {
            conds.push(format!("created_at_ms >= {}", bind(at(ms))));
        }
        if let Some(ms) = self.created_before {
            conds.push(format!("created_at_ms < {}", bind(at(ms))));
        }
        if let Some(ms) = self.updated_after {
            conds.push(format!("{} >= {}", d.updated, bind(at(ms))));
        }
        if let Some(ms) = self.updated_before {
            conds.push(format!("{} < {}", d.updated, bind(at(ms))));
        }
        if let Some(text) = &self.title {
            let t = bind(Param::Text(text.clone()));
            conds.push((d.title)(&t));
        }
        if let Some(cursor) = &self.after {
            let c = bind(at(cursor.created_at_ms));
            let c2 = bind(at(cursor.created_at_ms));
            let id = bind(Param::Text(cursor.id.clone()));
            conds.push(format!(
                "(created_at_ms < {c} OR (created_at_ms = {c2} AND id < {id}))"
            ));
        }
        let mut sql = String::new();
        if !conds.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conds.join(" AND "));
        }
        sql.push_str(" ORDER BY created_at_ms DESC, id DESC");
        if let Some(limit) = self.limit {
            sql.push_str(&format!(" LIMIT {}", bind(Param::Int(limit as i64 + 1))));
        }
        (sql, params)
    }

    /// A page of the rows [`SessionQuery::sql`] selected.
    pub(crate) fn page(&self, mut sessions: Vec<crate::SessionSummary>) -> SessionPage {
        let next = match self.limit {
            Some(limit) if sessions.len() > limit => {
                sessions.truncate(limit);
                sessions.last().map(|s| Cursor {
                    created_at_ms: s.created_at_ms,
                    id: s.id.clone(),
                })
            }
            _ => None,
        };
        SessionPage { sessions, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote_and_refuses_anything_else() {
        let c = Cursor {
            created_at_ms: 1_700_000_000_123,
            id: "ses_0190abc".into(),
        };
        assert_eq!(c.to_string().parse::<Cursor>().unwrap(), c);
        for bad in ["", "12", "x.ses_1", "12.", "12.a'b", "12.a b"] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?} taken");
        }
    }

    #[test]
    fn labels_are_plain_words_and_the_filter_names_what_is_wrong() {
        assert_eq!(
            parse_label_filter("label", "team=infra,env=prod").unwrap(),
            BTreeMap::from([
                ("env".to_string(), "prod".to_string()),
                ("team".to_string(), "infra".to_string())
            ])
        );
        let e = parse_label_filter("label", "team").unwrap_err();
        assert!(e.starts_with("label:"), "{e}");
        assert!(check_label("labels", "-x", Some("a")).is_err());
        assert!(check_label("labels", "a b", Some("a")).is_err());
        assert!(check_label("labels", "team", Some("a,b")).is_err());
        assert!(check_label("labels", "example.com/team", Some("")).is_ok());
    }

    #[test]
    fn a_patch_merges_key_by_key_and_keeps_the_bounds() {
        let patch = SessionPatch {
            labels: BTreeMap::from([
                ("a".to_string(), Some("1".to_string())),
                ("b".to_string(), None),
            ]),
            ..Default::default()
        };
        let (labels, metadata) = patch.merged(r#"{"b":"2","c":"3"}"#, "{}").unwrap();
        assert_eq!(labels, r#"{"a":"1","c":"3"}"#);
        assert_eq!(metadata, "{}");
        let many = SessionPatch {
            labels: (0..=MAX_LABELS)
                .map(|i| (format!("k{i}"), Some("v".to_string())))
                .collect(),
            ..Default::default()
        };
        assert!(matches!(
            many.merged("{}", "{}"),
            Err(crate::Error::Invalid(m)) if m.starts_with("labels:")
        ));
    }
}
