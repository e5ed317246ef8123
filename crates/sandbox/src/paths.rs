//! Confining file-tool paths to the workspace; where sockets live.

use std::path::{Component, Path, PathBuf};

/// The longest directory run directories holding Unix sockets are made under: a
/// socket's path must fit in `sun_path` (108 bytes) with the run directory's name
/// (about 50) and the socket's (about 15) after it.
const SOCKET_ROOT_MAX: usize = 40;

/// Where run directories holding Unix sockets are made (the sandbox agent's, a wrapped
/// CLI's gateway and MCP server): the temporary directory, unless its path is too long
/// for a socket path under it, then `/tmp`.
pub fn socket_root() -> PathBuf {
    let tmp = std::env::temp_dir();
    if tmp.as_os_str().len() <= SOCKET_ROOT_MAX {
        tmp
    } else {
        PathBuf::from("/tmp")
    }
}

/// Resolves a path given by the model against the workspace `root` (canonical), and
/// refuses any that lead outside it: `..` past the root, absolute paths elsewhere, and
/// symlinks (existing or dangling) whose target is outside. Returns the path to use.
pub fn confine(root: &Path, raw: &str) -> Result<PathBuf, String> {
    if raw.trim().is_empty() {
        return Err("path is empty".to_string());
    }
    let outside = || format!("path {raw} is outside the workspace ({})", root.display());
    let joined = if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        root.join(raw)
    };
    let mut normal = PathBuf::new();
    for part in joined.components() {
        match part {
            Component::ParentDir => {
                if !normal.pop() {
                    return Err(outside());
                }
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    if !normal.starts_with(root) {
        return Err(outside());
    }
    // Follow symlinks through the part of the path that exists.
    let mut existing = normal.clone();
    let mut rest = Vec::new();
    loop {
        match std::fs::symlink_metadata(&existing) {
            Ok(meta) => {
                let resolved = match existing.canonicalize() {
                    Ok(p) => p,
                    Err(_) if meta.file_type().is_symlink() => {
                        return Err(format!("path {raw} is a dangling symlink"))
                    }
                    Err(e) => return Err(format!("path {raw}: {e}")),
                };
                if !resolved.starts_with(root) {
                    return Err(format!(
                        "path {raw} resolves through a symlink to {}, outside the workspace",
                        resolved.display()
                    ));
                }
                let mut full = resolved;
                for part in rest.iter().rev() {
                    full.push(part);
                }
                return Ok(full);
            }
            Err(_) => {
                let Some(name) = existing.file_name().map(|n| n.to_os_string()) else {
                    return Err(outside());
                };
                rest.push(name);
                if !existing.pop() {
                    return Err(outside());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_every_way_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let root = root.canonicalize().unwrap();
        std::fs::write(dir.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("leak")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/x", root.join("dangling")).unwrap();

        for bad in [
            "../secret",
            "sub/../../secret",
            "/etc/passwd",
            "leak",
            "up/secret",
            "up/new",
            "dangling",
            "",
        ] {
            assert!(confine(&root, bad).is_err(), "{bad} should be refused");
        }
        assert_eq!(confine(&root, "sub/../a.txt").unwrap(), root.join("a.txt"));
        assert_eq!(confine(&root, "new/dir/f").unwrap(), root.join("new/dir/f"));
        let abs = root.join("sub").display().to_string();
        assert_eq!(confine(&root, &abs).unwrap(), root.join("sub"));
    }
}
