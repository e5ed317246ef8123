//! `read`, `write` and `edit`, confined to the workspace.

use std::path::Path;

use serde_json::Value;

use super::{open, opt_u64, str_arg};
use crate::confine;

const DEFAULT_LIMIT: usize = 2000;
const MAX_LINE: usize = 2000;
const PATH_KEYS: &[&str] = &["file_path", "path"];

fn display(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

pub(crate) fn read(root: &Path, input: &Value) -> Result<String, String> {
    let raw = str_arg(input, PATH_KEYS)?;
    let path = confine(root, raw)?;
    if path.is_dir() {
        return Err(format!(
            "{raw} is a directory; use glob or bash ls to list it"
        ));
    }
    let (bytes, len) = open::read_bounded(&path, raw, open::MAX_READ)?;
    if bytes.contains(&0) {
        return Err(format!("{raw} is a binary file ({len} bytes)"));
    }
    let text = String::from_utf8_lossy(&bytes);
    if text.is_empty() {
        return Ok(format!("({raw} is empty)"));
    }
    let offset = opt_u64(input, "offset").unwrap_or(1).max(1) as usize;
    let limit = opt_u64(input, "limit")
        .map(|l| l as usize)
        .unwrap_or(DEFAULT_LIMIT);
    let lines: Vec<&str> = text.lines().collect();
    if offset > lines.len() {
        return Err(format!(
            "offset {offset} is past the end of {raw} ({} lines)",
            lines.len()
        ));
    }
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate().skip(offset - 1).take(limit) {
        let shown: String = line.chars().take(MAX_LINE).collect();
        out.push_str(&format!("{:>6}\t{shown}\n", i + 1));
    }
    let end = (offset - 1 + limit).min(lines.len());
    if end < lines.len() {
        out.push_str(&format!(
            "[{} more lines; read with offset={}]\n",
            lines.len() - end,
            end + 1
        ));
    }
    if len > bytes.len() as u64 {
        out.push_str(&format!(
            "[{raw} is {len} bytes; only its first {} were read: use bash (tail, sed -n) for the rest]\n",
            bytes.len()
        ));
    }
    Ok(out)
}

pub(crate) fn write(root: &Path, input: &Value) -> Result<String, String> {
    let raw = str_arg(input, PATH_KEYS)?;
    let content = str_arg(input, &["content"])?;
    let path = confine(root, raw)?;
    if path.is_dir() {
        return Err(format!("{raw} is a directory"));
    }
    open::write_regular(&path, raw, content.as_bytes())?;
    Ok(format!(
        "Wrote {} bytes to {}",
        content.len(),
        display(root, &path)
    ))
}

pub(crate) fn edit(root: &Path, input: &Value) -> Result<String, String> {
    let raw = str_arg(input, PATH_KEYS)?;
    let old = str_arg(input, &["old_string"])?;
    let new = str_arg(input, &["new_string"])?;
    let replace_all = input
        .get("replace_all")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let path = confine(root, raw)?;
    if old == new {
        return Err("old_string and new_string are the same; nothing to change".into());
    }
    if old.is_empty() {
        if path.exists() {
            return Err(format!(
                "{raw} already exists; an empty old_string only creates new files"
            ));
        }
        open::write_regular(&path, raw, new.as_bytes())?;
        return Ok(format!("Created {}", display(root, &path)));
    }
    let (bytes, len) = open::read_bounded(&path, raw, open::MAX_READ)?;
    if len > bytes.len() as u64 {
        return Err(format!(
            "{raw} is {len} bytes, more than this tool edits ({} bytes): edit it with bash",
            open::MAX_READ
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{raw} is not UTF-8 text"))?;
    let count = text.matches(old).count();
    let replaced = match (count, replace_all) {
        (0, _) => return Err(format!("old_string was not found in {raw}")),
        (1, _) | (_, true) => text.replace(old, new),
        (n, false) => {
            return Err(format!(
                "old_string occurs {n} times in {raw}; give more surrounding context to make it unique, or set replace_all"
            ))
        }
    };
    open::write_regular(&path, raw, replaced.as_bytes())?;
    Ok(format!(
        "Edited {}: replaced {count} occurrence{}",
        display(root, &path),
        if count == 1 { "" } else { "s" }
    ))
}
