//! `read`, `write` and `edit`, confined to the workspace.

use std::path::Path;

use serde_json::Value;

use super::{opt_u64, str_arg};
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
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {raw}: {e}"))?;
    if bytes.contains(&0) {
        return Err(format!("{raw} is a binary file ({} bytes)", bytes.len()));
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
    Ok(out)
}

fn write_file(path: &Path, content: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::write(path, content).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

pub(crate) fn write(root: &Path, input: &Value) -> Result<String, String> {
    let raw = str_arg(input, PATH_KEYS)?;
    let content = str_arg(input, &["content"])?;
    let path = confine(root, raw)?;
    if path.is_dir() {
        return Err(format!("{raw} is a directory"));
    }
    write_file(&path, content)?;
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
        write_file(&path, new)?;
        return Ok(format!("Created {}", display(root, &path)));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {raw}: {e}"))?;
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
    write_file(&path, &replaced)?;
    Ok(format!(
        "Edited {}: replaced {count} occurrence{}",
        display(root, &path),
        if count == 1 { "" } else { "s" }
    ))
}
