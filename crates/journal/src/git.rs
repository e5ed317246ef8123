//! Repositories a workspace comes from and goes back to, with credentials the sandbox
//! never holds ("resource-bundled auth").
//!
//! The harness clones a session's repository into its workspace outside any sandbox,
//! the credential passed to git in its environment (never in a URL, a file or `.git`),
//! so the sandbox gets a working tree whose remote carries no secret. When the model
//! asks for a push (the [`GIT_PUSH_TOOL`], an external effect), the code inside the
//! sandbox packs the commits into a bundle, and the harness — again outside the
//! sandbox — fetches that bundle into a scratch repository of its own (every object
//! checked) and pushes from there. The harness never runs git *in* the workspace's
//! repository, whose configuration the sandbox controls (hooks, `credential.helper`,
//! `url.*.insteadOf`, `http.proxy` would all hand the credential to the sandbox's
//! code); reading a bundle is safe whatever wrote it.
//!
//! Every git the harness runs has an empty environment but `PATH`, no system or
//! global configuration, only the `http` and `https` transports, no redirects (which
//! would carry the credential to another host) and no prompts.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use steadfast_log::GitSource;
use steadfast_sandbox::outbound::Screened;
use steadfast_sandbox::reconcile::Verdict;
use steadfast_sandbox::{HostRule, ToolOutput};

/// The native agent's tool that pushes a branch of the workspace's repository to the
/// repository it was cloned from.
pub const GIT_PUSH_TOOL: &str = "git_push";

/// The bundle the sandbox writes at the workspace's root for the harness to push.
pub const PUSH_BUNDLE: &str = ".steadfast-push.bundle";

/// How long a clone may take before it is abandoned.
const CLONE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a push or a remote query may take.
const PUSH_TIMEOUT: Duration = Duration::from_secs(300);

/// The `git_push` tool, offered to the native model when its workspace came from git.
pub fn push_tool() -> steadfast_model::ToolDef {
    steadfast_model::ToolDef {
        name: GIT_PUSH_TOOL.into(),
        description: "Push a commit of the workspace's git repository to a branch of the \
            repository it was cloned from (the `origin` remote). Commit first; this pushes \
            what is committed. Run outside the sandbox with the session's credential: \
            `git push` inside the sandbox has neither."
            .into(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {
                "branch": {"type": "string", "description": "The remote branch to push to"},
                "ref": {"type": "string", "description": "What to push: a branch, tag or HEAD (default HEAD)"},
                "force": {"type": "boolean", "description": "Overwrite the branch even if that loses commits (default false)"}
            },
            "required": ["branch"]
        }),
    }
}

/// A session's repository and the credential to push to it with (opened from the
/// vault when a worker takes the session up): the one place `git_push` is run and a
/// cut-off one decided, for the native loop and wrapped CLIs alike. The sandbox's part
/// (bundling, reading a commit) runs through the caller's `in_sandbox`.
#[derive(Debug)]
pub struct GitPusher {
    source: GitSource,
    credential: Option<GitCredential>,
    workspace: PathBuf,
    open: Vec<HostRule>,
}

impl GitPusher {
    /// Pushes to `source` with `credential`, from the repository in `workspace`; an
    /// internal remote only if the operator opened it (`open`, see [`screen`]).
    pub fn new(
        source: GitSource,
        credential: Option<GitCredential>,
        workspace: PathBuf,
        open: Vec<HostRule>,
    ) -> Self {
        GitPusher {
            source,
            credential,
            workspace,
            open,
        }
    }

    /// Runs a `git_push` call: the sandbox bundles the commit, the harness pushes the
    /// bundle with the credential. What goes wrong is the model's to read, as a tool
    /// error; only a failure of the sandbox itself is an `Err`.
    pub async fn push<F, Fut, E>(
        &self,
        input: &serde_json::Value,
        in_sandbox: F,
    ) -> Result<ToolOutput, E>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<ToolOutput, E>>,
    {
        let push = match PushRequest::parse(input) {
            Ok(push) => push,
            Err(e) => return Ok(ToolOutput::error(e)),
        };
        let packed = in_sandbox(push.bundle_command()).await?;
        let commit = printed_commit(&packed.text).filter(|_| !packed.is_error);
        let bundle = take_bundle(&self.workspace);
        let Some(commit) = commit else {
            return Ok(ToolOutput::error(packed.text));
        };
        let (_scratch, bundle) = match bundle {
            Ok(taken) => taken,
            Err(e) => return Ok(ToolOutput::error(e)),
        };
        let credential = self.credential.as_ref();
        let pushed = async {
            let pin = screen(&self.source, &self.open).await?;
            push_bundle(&bundle, &commit, &self.source, credential, &push, &pin).await
        };
        Ok(match pushed.await {
            Ok(()) => ToolOutput::ok(format!(
                "pushed {commit} to branch `{}` of {}",
                push.branch, self.source.url
            )),
            Err(e) => ToolOutput::error(e),
        })
    }

    /// The invariant-4 resolution of a `git_push` a crash cut off, for every agent:
    /// [`GitPusher::reconcile`]'s verdict, or outcome unknown when it cannot tell.
    pub async fn resolve<F, Fut, E>(
        &self,
        input: &serde_json::Value,
        in_sandbox: F,
    ) -> steadfast_log::ToolResolution
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<ToolOutput, E>>,
        E: std::fmt::Display,
    {
        match self.reconcile(input, in_sandbox).await {
            Ok(verdict) => steadfast_sandbox::reconcile::resolution(verdict),
            Err(why) => {
                tracing::warn!(%why, "could not reconcile a push");
                steadfast_log::ToolResolution::OutcomeUnknown
            }
        }
    }

    /// Whether a `git_push` a crash cut off took place: done if the remote branch is at
    /// the commit the workspace (restored to before the call) would push; otherwise not
    /// done, and it runs once more.
    pub async fn reconcile<F, Fut, E>(
        &self,
        input: &serde_json::Value,
        in_sandbox: F,
    ) -> Result<Verdict, String>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<ToolOutput, E>>,
        E: std::fmt::Display,
    {
        let push = PushRequest::parse(input)?;
        let local = in_sandbox(push.commit_command())
            .await
            .map_err(|e| e.to_string())?;
        let Some(local) = printed_commit(&local.text) else {
            return Ok(Verdict::Unknown(format!(
                "no commit `{}` in the workspace",
                push.reference
            )));
        };
        let remote = remote_tip(
            &self.source,
            self.credential.as_ref(),
            &push.branch,
            &self.open,
        )
        .await?;
        Ok(if remote.as_deref() == Some(local.as_str()) {
            Verdict::Done(format!(
                "pushed {local} to branch `{}` of {} (the push was cut off; the branch is there)",
                push.branch, self.source.url
            ))
        } else {
            Verdict::NotDone(format!(
                "branch `{}` is at {}, not {local}",
                push.branch,
                remote.as_deref().unwrap_or("nothing")
            ))
        })
    }
}

/// Checks a workspace source before anything is made: an `http(s)` URL with no user
/// or password in it (the credential goes by name), and ref names git accepts.
/// `https_only` refuses plain `http` (public servers).
pub fn check_source(source: &GitSource, https_only: bool) -> Result<(), String> {
    let url = &source.url;
    let rest = match url.split_once("://") {
        Some(("https", rest)) => rest,
        Some(("http", rest)) if !https_only => rest,
        _ if https_only => return Err("workspace.url: must be an https:// URL".into()),
        _ => return Err("workspace.url: must be an http:// or https:// URL".into()),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(
            "workspace.url: must not carry a user or password; name a vault credential instead"
                .into(),
        );
    }
    if authority.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "workspace.url: `{}` is not a URL",
            url.escape_debug()
        ));
    }
    if let Some(reference) = &source.reference {
        check_ref(reference).map_err(|e| format!("workspace.ref: {e}"))?;
    }
    if source.username.is_empty() || source.username.contains([':', '\n', '\r']) {
        return Err("workspace.username: must be a non-empty name without `:`".into());
    }
    Ok(())
}

/// Checks a branch, tag or `HEAD` named by the API or the model: a name git's
/// `check-ref-format` takes, which is also safe to quote for a shell.
pub(crate) fn check_ref(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with(['-', '/', '.'])
        && !name.ends_with(['/', '.'])
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("//")
        && !name.contains("@{")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "`{}` is not a branch or tag name",
            name.escape_debug()
        ))
    }
}

/// Whether `name` is a full commit id (which `git clone --branch` does not take).
fn is_commit_id(name: &str) -> bool {
    name.len() == 40 && name.chars().all(|c| c.is_ascii_hexdigit())
}

/// A credential as git sends it (HTTP basic auth). Kept out of `Debug` output, and
/// wiped from any error text git prints.
#[derive(Clone)]
pub struct GitCredential {
    secret: String,
    header: String,
}

impl std::fmt::Debug for GitCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GitCredential(..)")
    }
}

impl GitCredential {
    /// `username` with `secret` (a token or password), as HTTP basic auth.
    pub fn basic(username: &str, secret: &str) -> Self {
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{secret}"));
        GitCredential {
            secret: secret.to_string(),
            header: format!("Authorization: Basic {pair}"),
        }
    }

    fn redact(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in [&self.secret, &self.header] {
            if !secret.is_empty() {
                text = text.replace(secret.as_str(), "[credential]");
            }
        }
        text
    }
}

/// A git command with nothing of the host's configuration or environment, only the
/// transports and behaviour named in the module's documentation, and `credential`
/// sent with every HTTP request (from the environment: no file, no argument).
fn git(
    scratch: &Path,
    credential: Option<&GitCredential>,
    pin: Option<&Screened>,
) -> tokio::process::Command {
    let mut settings = vec![
        ("protocol.allow", "never".to_string()),
        ("protocol.https.allow", "always".to_string()),
        ("protocol.http.allow", "always".to_string()),
        ("http.followRedirects", "false".to_string()),
        ("credential.helper", String::new()),
        ("core.hooksPath", "/dev/null".to_string()),
        ("transfer.fsckObjects", "true".to_string()),
        ("init.defaultBranch", "main".to_string()),
    ];
    if let Some(credential) = credential {
        settings.push(("http.extraHeader", credential.header.clone()));
    }
    // Connected to the remote's screened addresses only (see `screen`).
    if let Some(pin) = pin {
        settings.push(("http.curloptResolve", pin.curl_resolve()));
    }
    let mut cmd = tokio::process::Command::new("git");
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("HOME", scratch)
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_COUNT", settings.len().to_string());
    for (i, (key, value)) in settings.into_iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), key)
            .env(format!("GIT_CONFIG_VALUE_{i}"), value);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs `cmd`, giving its stdout, or its stderr (credential wiped) as the error.
async fn run(
    mut cmd: tokio::process::Command,
    what: &str,
    timeout: Duration,
    credential: Option<&GitCredential>,
) -> Result<String, String> {
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| format!("{what}: no answer within {} s", timeout.as_secs()))?
        .map_err(|e| format!("{what}: cannot run git: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = match credential {
        Some(c) => c.redact(&stderr),
        None => stderr.into_owned(),
    };
    Err(format!("{what}: {}", stderr.trim()))
}

/// The remote's addresses, screened like every destination a session names (see
/// [`steadfast_sandbox::outbound`]): an internal one only if the operator opened it.
/// Git is then pinned to them (`http.curloptResolve`), so it cannot be sent elsewhere
/// by a second lookup.
pub async fn screen(source: &GitSource, open: &[HostRule]) -> Result<Screened, String> {
    steadfast_sandbox::outbound::screen_url(&source.url, open)
        .await
        .map_err(|e| format!("the remote is not allowed: {e}"))
}

/// Clones `source` into `dir` (an empty directory), the credential in git's
/// environment only; the clone's `origin` is the plain URL and its `.git/config` holds
/// nothing secret. Commits made in the sandbox get a default author. An internal
/// remote is refused unless the operator opened it (`open`, see [`screen`]).
pub async fn clone(
    source: &GitSource,
    credential: Option<&GitCredential>,
    dir: &Path,
    open: &[HostRule],
) -> Result<(), String> {
    let pin = screen(source, open).await?;
    let scratch = tempfile::tempdir().map_err(|e| format!("clone: {e}"))?;
    let commit = source.reference.as_deref().filter(|r| is_commit_id(r));
    let mut cmd = git(scratch.path(), credential, Some(&pin));
    cmd.args(["clone", "--quiet", "--no-recurse-submodules"]);
    match (&source.reference, commit) {
        (Some(reference), None) => {
            cmd.arg(format!("--branch={reference}"));
        }
        (Some(_), Some(_)) => {
            cmd.arg("--no-checkout");
        }
        (None, _) => {}
    }
    cmd.arg("--").arg(&source.url).arg(dir);
    run(cmd, "clone", CLONE_TIMEOUT, credential).await?;
    if let Some(commit) = commit {
        // A commit named by its id: checked out detached, in the fresh clone (whose
        // configuration and hooks are git's defaults, nothing the remote chose).
        let mut cmd = git(scratch.path(), None, None);
        cmd.arg("-C").arg(dir);
        cmd.args(["checkout", "--quiet", "--detach", commit]);
        run(cmd, "clone: ref", PUSH_TIMEOUT, None).await?;
    }
    for (key, value) in [
        ("user.name", "Steadfast agent"),
        ("user.email", "agent@steadfast.invalid"),
    ] {
        let mut cmd = git(scratch.path(), None, None);
        cmd.arg("--git-dir").arg(dir.join(".git"));
        cmd.args(["config", key, value]);
        run(cmd, "clone", PUSH_TIMEOUT, None).await?;
    }
    Ok(())
}

/// The commit `branch` points at in the remote repository, if it exists.
pub async fn remote_tip(
    source: &GitSource,
    credential: Option<&GitCredential>,
    branch: &str,
    open: &[HostRule],
) -> Result<Option<String>, String> {
    let pin = screen(source, open).await?;
    let scratch = tempfile::tempdir().map_err(|e| format!("ls-remote: {e}"))?;
    let mut cmd = git(scratch.path(), credential, Some(&pin));
    cmd.args(["ls-remote", "--heads", &source.url])
        .arg(format!("refs/heads/{branch}"));
    let listed = run(cmd, "ls-remote", PUSH_TIMEOUT, credential).await?;
    Ok(listed
        .lines()
        .find_map(|line| line.split_once('\t'))
        .filter(|(_, name)| *name == format!("refs/heads/{branch}"))
        .map(|(sha, _)| sha.to_string()))
}

/// What a push asks for, checked: the remote branch, the local ref, and whether it may
/// overwrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PushRequest {
    pub branch: String,
    pub reference: String,
    pub force: bool,
}

impl PushRequest {
    /// Reads the model's input to `git_push`.
    pub fn parse(input: &serde_json::Value) -> Result<Self, String> {
        let branch = input
            .get("branch")
            .and_then(|b| b.as_str())
            .ok_or("git_push: `branch` is required")?
            .trim_start_matches("refs/heads/")
            .to_string();
        check_ref(&branch).map_err(|e| format!("git_push: branch: {e}"))?;
        let reference = input
            .get("ref")
            .and_then(|r| r.as_str())
            .unwrap_or("HEAD")
            .to_string();
        check_ref(&reference).map_err(|e| format!("git_push: ref: {e}"))?;
        let force = input
            .get("force")
            .and_then(|f| f.as_bool())
            .unwrap_or(false);
        Ok(PushRequest {
            branch,
            reference,
            force,
        })
    }

    /// The command the sandbox runs to pack what is to be pushed: it prints the commit
    /// and writes the bundle at the workspace's root. (The names were checked, so they
    /// need no quoting beyond single quotes.)
    pub fn bundle_command(&self) -> String {
        let r = &self.reference;
        format!(
            "set -e; rm -f {PUSH_BUNDLE}; \
             sha=$(git rev-parse --verify --quiet '{r}^{{commit}}') || \
             {{ echo \"there is no commit '{r}' in the workspace's repository\" >&2; exit 1; }}; \
             git bundle create --quiet {PUSH_BUNDLE} '{r}'; echo \"commit=$sha\""
        )
    }

    /// The command the sandbox runs to say which commit `ref` is (for deciding, after
    /// a crash, whether a push took place).
    pub fn commit_command(&self) -> String {
        format!("git rev-parse --verify '{}^{{commit}}'", self.reference)
    }
}

/// The commit a [`PushRequest::bundle_command`] or
/// [`PushRequest::commit_command`] printed.
pub(crate) fn printed_commit(text: &str) -> Option<String> {
    text.lines()
        .map(|l| l.trim().trim_start_matches("commit="))
        .find(|l| l.len() == 40 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// Takes the bundle the sandbox wrote at the root of `workspace` out of it, refusing
/// anything but a regular file there (a symlink would point the harness at a file of
/// its own choosing).
pub(crate) fn take_bundle(workspace: &Path) -> Result<(tempfile::TempDir, PathBuf), String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = workspace.join(PUSH_BUNDLE);
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(&path);
    let result = (|| {
        let mut file = opened.map_err(|e| format!("git_push: the bundle: {e}"))?;
        if !file.metadata().map_err(|e| e.to_string())?.is_file() {
            return Err("git_push: the bundle is not a regular file".to_string());
        }
        let scratch = tempfile::tempdir().map_err(|e| format!("git_push: {e}"))?;
        let copy = scratch.path().join("push.bundle");
        let mut out = std::fs::File::create(&copy).map_err(|e| format!("git_push: {e}"))?;
        std::io::copy(&mut file, &mut out).map_err(|e| format!("git_push: the bundle: {e}"))?;
        Ok((scratch, copy))
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// Pushes `commit`, read from the `bundle` the sandbox made, to `branch` of
/// `source`: fetched into a scratch repository of the harness's (objects checked),
/// then pushed from there with the credential.
pub(crate) async fn push_bundle(
    bundle: &Path,
    commit: &str,
    source: &GitSource,
    credential: Option<&GitCredential>,
    push: &PushRequest,
    pin: &Screened,
) -> Result<(), String> {
    let scratch = tempfile::tempdir().map_err(|e| format!("git_push: {e}"))?;
    let repo = scratch.path().join("repo.git");
    let mut init = git(scratch.path(), None, None);
    init.args(["init", "--quiet", "--bare"]).arg(&repo);
    run(init, "git_push", PUSH_TIMEOUT, None).await?;
    let mut fetch = git(scratch.path(), None, None);
    // A bundle is read through the `file` transport: allowed for this one command,
    // whose source is the harness's own copy.
    fetch
        .args(["-c", "protocol.file.allow=always"])
        .arg("--git-dir")
        .arg(&repo)
        .args(["fetch", "--quiet", "--no-tags"])
        .arg(bundle)
        .arg(format!("{commit}:refs/steadfast/push"));
    run(fetch, "git_push: reading the bundle", PUSH_TIMEOUT, None).await?;
    let mut send = git(scratch.path(), credential, Some(pin));
    send.arg("--git-dir")
        .arg(&repo)
        .args(["push", "--quiet", "--no-verify"]);
    if push.force {
        send.arg("--force");
    }
    send.arg(&source.url)
        .arg(format!("refs/steadfast/push:refs/heads/{}", push.branch));
    run(send, "git_push", PUSH_TIMEOUT, credential).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source(url: &str) -> GitSource {
        GitSource {
            url: url.into(),
            reference: None,
            credential: None,
            username: "x-access-token".into(),
        }
    }

    #[test]
    fn urls_carry_no_secret_and_only_http_transports() {
        assert!(check_source(&source("https://example.com/a.git"), true).is_ok());
        assert!(check_source(&source("http://127.0.0.1:8080/a.git"), false).is_ok());
        for (url, https_only, says) in [
            ("http://example.com/a.git", true, "https://"),
            ("https://tok@example.com/a.git", false, "user or password"),
            ("https://u:p@example.com/a.git", false, "user or password"),
            ("file:///srv/repo.git", false, "http://"),
            ("ext::sh -c touch% /tmp/pwned", false, "http://"),
            ("ssh://git@example.com/a.git", false, "http://"),
            ("--upload-pack=touch /tmp/x", false, "http://"),
            ("https:///a.git", false, "not a URL"),
            ("https://example.com/a b", false, "not a URL"),
        ] {
            let err = check_source(&source(url), https_only).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn ref_names_are_what_git_takes_and_safe_to_quote() {
        for good in ["main", "HEAD", "feature/x-1", "v1.2.3", "release_2"] {
            assert!(check_ref(good).is_ok(), "{good}");
        }
        for bad in [
            "", "-f", "a..b", "a b", "a'b", "$(id)", "a;b", "/a", "a/", "a.lock", "x@{1}", "a//b",
            ".hidden",
        ] {
            assert!(check_ref(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_push_request_is_read_and_checked() {
        let push = PushRequest::parse(&json!({"branch": "refs/heads/feature"})).unwrap();
        assert_eq!(
            push,
            PushRequest {
                branch: "feature".into(),
                reference: "HEAD".into(),
                force: false
            }
        );
        assert!(PushRequest::parse(&json!({})).is_err());
        assert!(PushRequest::parse(&json!({"branch": "x", "ref": "a;rm -rf /"})).is_err());
        assert_eq!(
            printed_commit("noise\ncommit=0123456789abcdef0123456789abcdef01234567\n"),
            Some("0123456789abcdef0123456789abcdef01234567".into())
        );
    }

    #[test]
    fn errors_never_show_the_credential() {
        let credential = GitCredential::basic("x-access-token", "hunter2-token");
        let said = credential.redact(&format!(
            "fatal: could not read from https://x:hunter2-token@h/ ({})",
            credential.header
        ));
        assert!(
            !said.contains("hunter2-token") && !said.contains("Basic"),
            "{said}"
        );
        assert_eq!(format!("{credential:?}"), "GitCredential(..)");
    }
}
