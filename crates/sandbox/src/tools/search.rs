//! `glob` and `grep` over the workspace (skipping `.git` and the runtime's directory).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use globset::{Glob, GlobMatcher};
use regex::RegexBuilder;
use serde_json::Value;
use walkdir::WalkDir;

use super::{opt_u64, str_arg};
use crate::confine;

const MAX_RESULTS: usize = 1000;
const MAX_FILE: u64 = 10 * 1024 * 1024;

fn files_under(root: &Path, base: &Path) -> impl Iterator<Item = (PathBuf, String)> + use<> {
    let root = root.to_path_buf();
    WalkDir::new(base)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            !(e.file_type().is_dir()
                && matches!(e.file_name().to_str(), Some(".git" | ".steadfast")))
        })
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(move |e| {
            let rel = e
                .path()
                .strip_prefix(&root)
                .unwrap_or(e.path())
                .display()
                .to_string();
            (e.into_path(), rel)
        })
}

fn base(root: &Path, input: &Value) -> Result<PathBuf, String> {
    match input.get("path").and_then(Value::as_str) {
        Some(p) if !p.is_empty() => confine(root, p),
        _ => Ok(root.to_path_buf()),
    }
}

fn matcher(pattern: &str) -> Result<GlobMatcher, String> {
    Glob::new(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("invalid glob pattern {pattern}: {e}"))
}

pub(crate) fn glob(root: &Path, input: &Value) -> Result<String, String> {
    let pattern = str_arg(input, &["pattern"])?;
    let base = base(root, input)?;
    let m = matcher(pattern)?;
    let mut hits: Vec<(SystemTime, String)> = files_under(root, &base)
        .filter(|(path, rel)| {
            let from_base = path.strip_prefix(&base).unwrap_or(path);
            m.is_match(from_base) || m.is_match(rel)
        })
        .map(|(path, rel)| {
            let mtime = path
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (mtime, rel)
        })
        .collect();
    if hits.is_empty() {
        return Ok("No files found".into());
    }
    hits.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let total = hits.len();
    let mut out: Vec<String> = hits.into_iter().take(MAX_RESULTS).map(|(_, r)| r).collect();
    if total > MAX_RESULTS {
        out.push(format!("[{} more files not shown]", total - MAX_RESULTS));
    }
    Ok(out.join("\n"))
}

pub(crate) fn grep(root: &Path, input: &Value) -> Result<String, String> {
    let pattern = str_arg(input, &["pattern"])?;
    let insensitive = input.get("-i").and_then(Value::as_bool).unwrap_or(false);
    let re = RegexBuilder::new(pattern)
        .case_insensitive(insensitive)
        .build()
        .map_err(|e| format!("invalid regular expression: {e}"))?;
    let filter = match input.get("glob").and_then(Value::as_str) {
        Some(g) => Some(matcher(g)?),
        None => None,
    };
    let mode = input
        .get("output_mode")
        .and_then(Value::as_str)
        .unwrap_or("files_with_matches");
    if !matches!(mode, "files_with_matches" | "content" | "count") {
        return Err(format!(
            "unknown output_mode {mode}; use files_with_matches, content or count"
        ));
    }
    let limit = opt_u64(input, "head_limit")
        .map(|l| l as usize)
        .unwrap_or(MAX_RESULTS);
    let base = base(root, input)?;
    let mut out = Vec::new();
    for (path, rel) in files_under(root, &base) {
        if let Some(f) = &filter {
            let name = path.file_name().map(Path::new).unwrap_or(&path);
            if !f.is_match(&rel) && !f.is_match(name) {
                continue;
            }
        }
        // Never blocks: a file swapped for a FIFO since the walk is refused.
        let Ok((bytes, len)) = super::open::read_bounded(&path, &rel, MAX_FILE) else {
            continue;
        };
        if len > MAX_FILE {
            continue;
        }
        if bytes.contains(&0) {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        let matching: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| re.is_match(l))
            .collect();
        if matching.is_empty() {
            continue;
        }
        match mode {
            "content" => {
                for (n, line) in matching {
                    out.push(format!("{rel}:{}:{line}", n + 1));
                }
            }
            "count" => out.push(format!("{rel}:{}", matching.len())),
            _ => out.push(rel),
        }
        if out.len() >= limit {
            out.truncate(limit);
            break;
        }
    }
    if out.is_empty() {
        return Ok("No matches found".into());
    }
    Ok(out.join("\n"))
}
