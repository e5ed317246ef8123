//! Where the CLI's state lives, found the way git finds `.git`, and how to print a
//! command line the user can run from anywhere.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How the home was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeSource {
    /// `--home` or `STEADFAST_HOME`.
    Given,
    /// A `.steadfast` directory here or in a parent directory.
    Found,
    /// The per-user default (`$XDG_DATA_HOME/steadfast`, `~/.local/share/steadfast`).
    User,
}

/// The home in use.
#[derive(Debug, Clone)]
pub struct Home {
    /// The directory (absolute where it could be made so).
    pub path: PathBuf,
    /// How it was chosen.
    pub source: HomeSource,
}

impl Home {
    /// `given` if set; else the nearest `.steadfast` directory from the current one
    /// upwards; else the per-user default.
    pub fn find(given: Option<PathBuf>) -> Home {
        let cwd = std::env::current_dir().ok();
        let absolute = |p: PathBuf| match (&cwd, p.is_absolute()) {
            (Some(cwd), false) => cwd.join(p),
            _ => p,
        };
        if let Some(path) = given {
            return Home {
                path: absolute(path),
                source: HomeSource::Given,
            };
        }
        if let Some(found) = cwd
            .iter()
            .flat_map(|c| c.ancestors())
            .map(|dir| dir.join(".steadfast"))
            .find(|candidate| candidate.is_dir())
        {
            return Home {
                path: found,
                source: HomeSource::Found,
            };
        }
        Home {
            path: user_home(),
            source: HomeSource::User,
        }
    }

    /// For commands that only read: an error naming where it looked when there is no
    /// home yet (so they create nothing).
    pub fn require(&self) -> anyhow::Result<&Path> {
        if self.path.is_dir() {
            return Ok(&self.path);
        }
        anyhow::bail!(
            "no Steadfast home at {} ({}); nothing has been run with this home yet. \
             Pass --home DIR (or set STEADFAST_HOME) to use another",
            self.path.display(),
            match self.source {
                HomeSource::Given => "given by --home or STEADFAST_HOME",
                HomeSource::Found | HomeSource::User =>
                    "no .steadfast directory here or above, so the per-user home",
            }
        )
    }
}

/// The per-user home: `$XDG_DATA_HOME/steadfast`, else `~/.local/share/steadfast`,
/// else `./.steadfast`.
fn user_home() -> PathBuf {
    if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(data).join("steadfast");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/steadfast"),
        None => PathBuf::from(".steadfast"),
    }
}

static INVOCATION: OnceLock<String> = OnceLock::new();

/// Remembers how to call this program again with `home` from any directory: the
/// bare name if `steadfast` on PATH is this program, else its full path (as after
/// `cargo run`); plus `--home` unless the home would be found anyway.
pub fn remember_invocation(home: &Home) {
    let exe = std::env::current_exe().ok();
    let on_path = which("steadfast");
    let program = match (&exe, &on_path) {
        (Some(exe), Some(found)) if same_file(exe, found) => "steadfast".to_string(),
        (Some(exe), _) => shell_quote(&exe.display().to_string()),
        (None, _) => "steadfast".to_string(),
    };
    let line = match home.source {
        HomeSource::User => program,
        _ if std::env::var_os("STEADFAST_HOME").is_some_and(|h| Path::new(&h) == home.path) => {
            program
        }
        _ => format!(
            "{program} --home {}",
            shell_quote(&home.path.display().to_string())
        ),
    };
    let _ = INVOCATION.set(line);
}

/// The command line that calls this program again (see [`remember_invocation`]).
pub fn me() -> &'static str {
    INVOCATION.get().map(String::as_str).unwrap_or("steadfast")
}

/// The name of the user this process runs as: `USER`, `LOGNAME`, else the user
/// database's name for its uid, else `uid <n>`.
pub fn user_name() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|var| std::env::var(var).ok())
        .find(|name| !name.is_empty())
        .or_else(|| {
            let uid = nix::unistd::getuid();
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .unwrap_or_else(|| format!("uid {}", nix::unistd::getuid()))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// `s` as one shell word.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_with_spaces_or_quotes_stay_one_word() {
        assert_eq!(shell_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(shell_quote("/my dir/x"), "'/my dir/x'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
