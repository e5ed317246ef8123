//! A person's shell in a session's sandbox: a PTY its agent starts on request, carried
//! to the host over the request's own connection, as a preview's TCP connection is.
//!
//! The shell runs with what any command there has (the sandbox's mounts, its
//! network policy, its environment without credentials). A *read-only* shell, the one
//! a person gets while a turn runs, is confined further before it starts, by the
//! kernel's Landlock: nothing it runs may write a file, bind a port, or signal a
//! process it did not start (the agent's commands), so watching a turn cannot change
//! it. A kernel without what that takes refuses a read-only shell; it is never a
//! writable one instead.
//!
//! **The wire.** After the agent's `ok` line, each side sends frames: a kind byte, a
//! big-endian 32-bit length, the payload ([`Frame`]). The host sends keystrokes and
//! window sizes; the agent sends the terminal's output, then the shell's exit code.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Most bytes one frame carries (a longer one is a broken peer).
pub const MAX_FRAME: u32 = 1 << 20;

/// The first argument that makes the agent's program confine itself and become a
/// read-only shell (see [`confine_and_exec`]).
pub(crate) const READ_ONLY_SHELL: &str = "--read-only-shell";

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for WindowSize {
    fn default() -> Self {
        WindowSize { rows: 24, cols: 80 }
    }
}

/// How a shell is asked for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShellRequest {
    /// The terminal's size at the start.
    #[serde(default)]
    pub size: WindowSize,
    /// The terminal type (`TERM`), letters, digits and `-._` only.
    #[serde(default)]
    pub term: Option<String>,
    /// Confine the shell so that it changes nothing (see the module's doc).
    #[serde(default)]
    pub read_only: bool,
    /// Whether the shell edits lines itself (readline). A client that types a script
    /// rather than keys turns it off, so the end of its input (Ctrl-D at a line's
    /// start) is the end of the shell's, as the terminal sees it.
    #[serde(default = "line_editing_by_default")]
    pub line_editing: bool,
}

fn line_editing_by_default() -> bool {
    true
}

/// One frame of a shell's connection (see the module's doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Keystrokes, host to shell.
    Input(Vec<u8>),
    /// The terminal's new size, host to shell.
    Resize(WindowSize),
    /// What the terminal shows, shell to host.
    Output(Vec<u8>),
    /// The shell ended with this code (a signal's death as 128 + the signal), shell
    /// to host; nothing follows.
    Exit(i32),
}

impl Frame {
    /// The frame's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, Vec<u8>) = match self {
            Frame::Input(bytes) => (0, bytes.clone()),
            Frame::Resize(size) => {
                let mut p = size.rows.to_be_bytes().to_vec();
                p.extend(size.cols.to_be_bytes());
                (1, p)
            }
            Frame::Output(bytes) => (2, bytes.clone()),
            Frame::Exit(code) => (3, code.to_be_bytes().to_vec()),
        };
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(kind);
        out.extend((payload.len() as u32).to_be_bytes());
        out.extend(payload);
        out
    }

    /// The next frame from `from`; `None` at a clean end between frames.
    pub async fn read(from: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<Frame>> {
        let mut head = [0u8; 5];
        match from.read_exact(&mut head[..1]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        from.read_exact(&mut head[1..]).await?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        if len > MAX_FRAME {
            return Err(std::io::Error::other(format!(
                "a shell frame of {len} bytes"
            )));
        }
        let mut payload = vec![0u8; len as usize];
        from.read_exact(&mut payload).await?;
        let bad = || std::io::Error::other(format!("a malformed shell frame of kind {}", head[0]));
        Ok(Some(match head[0] {
            0 => Frame::Input(payload),
            1 if payload.len() == 4 => Frame::Resize(WindowSize {
                rows: u16::from_be_bytes([payload[0], payload[1]]),
                cols: u16::from_be_bytes([payload[2], payload[3]]),
            }),
            2 => Frame::Output(payload),
            3 if payload.len() == 4 => Frame::Exit(i32::from_be_bytes([
                payload[0], payload[1], payload[2], payload[3],
            ])),
            _ => return Err(bad()),
        }))
    }

    /// Writes the frame to `to`.
    pub async fn write(&self, to: &mut (impl AsyncWrite + Unpin)) -> std::io::Result<()> {
        to.write_all(&self.encode()).await
    }
}

/// A terminal type safe to put in a shell's environment.
fn term_of(request: &ShellRequest) -> String {
    request
        .term
        .as_deref()
        .filter(|t| {
            !t.is_empty()
                && t.len() <= 64
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        })
        .unwrap_or("xterm-256color")
        .to_string()
}

/// The size a PTY is set to (zero cells are taken as the default's).
fn pty_size(size: WindowSize) -> pty_process::Size {
    let default = WindowSize::default();
    pty_process::Size::new(
        if size.rows == 0 {
            default.rows
        } else {
            size.rows
        },
        if size.cols == 0 {
            default.cols
        } else {
            size.cols
        },
    )
}

/// The shell program: `bash` where the sandbox has one.
fn shell_program() -> &'static str {
    ["/bin/bash", "/usr/bin/bash"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("/bin/sh")
}

/// Runs a shell for `request` in `workspace` with `env` on a new PTY, and carries it
/// over `host` (already told `ok`) until the shell ends or the host goes. `relaunch`:
/// the agent's own program and its arguments before its configuration, to start a
/// read-only shell through (see [`confine_and_exec`]). Each of its processes is held
/// to the memory and file size `limits` a command's are (a CPU limit, which an
/// interactive shell would use up by being open, is left out). The shell's processes
/// are spared by the clean-up after each command while it lives.
pub(crate) async fn serve(
    mut host: tokio::net::UnixStream,
    request: ShellRequest,
    workspace: &Path,
    env: &[(String, String)],
    relaunch: &[String],
    limits: &crate::ResourceLimits,
) -> std::io::Result<()> {
    let (pty, pts) = pty_process::open().map_err(std::io::Error::other)?;
    pty.resize(pty_size(request.size))
        .map_err(std::io::Error::other)?;
    let program = shell_program();
    let mut args: Vec<String> = vec!["-i".into()];
    if !request.line_editing && program.ends_with("bash") {
        // Long options come first.
        args.insert(0, "--noediting".into());
    }
    let mut ulimits = Vec::new();
    if let Some(mb) = limits.memory_mb {
        ulimits.push(format!("ulimit -v {}", mb * 1024));
    }
    if let Some(mb) = limits.file_mb {
        ulimits.push(format!("ulimit -f {}", mb * 1024));
    }
    if !ulimits.is_empty() {
        // The limits are set by a shell that then becomes the person's.
        let script = format!(
            "{} || exit 125; exec {program} {}",
            ulimits.join(" && "),
            args.join(" ")
        );
        args = vec!["-c".into(), script];
    }
    let command = match (request.read_only, relaunch.split_first()) {
        (true, Some((exe, args))) => pty_process::Command::new(exe)
            .args(args)
            .arg(READ_ONLY_SHELL)
            .arg(program),
        (true, None) => {
            return refuse(&mut host, "the sandbox cannot start a read-only shell").await;
        }
        (false, _) => pty_process::Command::new(program),
    };
    let mode = if request.read_only {
        "read-only"
    } else {
        "read-write"
    };
    let mut child = command
        .args(&args)
        .env_clear()
        .envs(env.iter().cloned())
        .env("TERM", term_of(&request))
        .env("STEADFAST_SHELL", mode)
        .current_dir(workspace)
        .kill_on_drop(true)
        .spawn(pts)
        .map_err(std::io::Error::other)?;
    let sid = child.id().map_or(0, |pid| pid as i32);
    crate::inside::spare_session(sid, true);
    let result = pump(&mut host, pty, &mut child).await;
    crate::inside::spare_session(sid, false);
    // Whatever the shell left running goes with it.
    crate::inside::kill_session(sid);
    result
}

/// Carries the PTY's bytes to `host` and `host`'s frames to the PTY until the shell
/// ends (then its exit code is sent) or the host goes (then the shell is killed).
async fn pump(
    host: &mut tokio::net::UnixStream,
    pty: pty_process::Pty,
    child: &mut tokio::process::Child,
) -> std::io::Result<()> {
    let (mut from_host, mut to_host) = host.split();
    let (mut from_pty, mut to_pty) = pty.into_split();
    let mut buf = vec![0u8; 16 * 1024];
    let mut exited = None;
    loop {
        tokio::select! {
            read = from_pty.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => Frame::Output(buf[..n].to_vec()).write(&mut to_host).await?,
            },
            frame = Frame::read(&mut from_host) => match frame {
                Ok(Some(Frame::Input(bytes))) => to_pty.write_all(&bytes).await?,
                Ok(Some(Frame::Resize(size))) => {
                    let _ = to_pty.resize(pty_size(size));
                }
                // The host went (or sent what only a shell sends): the shell goes.
                _ => {
                    let _ = child.start_kill();
                    return Ok(());
                }
            },
            status = child.wait(), if exited.is_none() => {
                exited = Some(status?);
            }
        }
    }
    let status = match exited {
        Some(status) => status,
        None => child.wait().await?,
    };
    let code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + status.signal().unwrap_or(0)
    });
    Frame::Exit(code).write(&mut to_host).await?;
    to_host.shutdown().await
}

/// Tells `host` why no shell starts.
async fn refuse(host: &mut tokio::net::UnixStream, why: &str) -> std::io::Result<()> {
    let mut line =
        serde_json::to_vec(&crate::ToolOutput::error(why)).map_err(std::io::Error::other)?;
    line.push(b'\n');
    host.write_all(&line).await?;
    host.shutdown().await
}

/// Confines this process so that nothing it runs can change the sandbox, then runs
/// `program` with `args` in its place: a read-only shell. Files are readable and runnable
/// everywhere and writable nowhere but the terminal and `/dev/null`; no TCP port may be
/// bound; no process outside the shell may be signalled, nor an abstract socket
/// outside it reached. Returns (an exit code) only if that cannot be done, which the
/// person sees on the terminal.
pub(crate) fn confine_and_exec(program: &str, args: &[String]) -> i32 {
    if let Err(why) = confine() {
        eprintln!(
            "steadfast: a read-only shell needs the kernel's Landlock (Linux 6.12 or newer, \
             with Landlock enabled), which this host cannot give: {why}"
        );
        return 126;
    }
    let err =
        std::os::unix::process::CommandExt::exec(std::process::Command::new(program).args(args));
    eprintln!("steadfast: {program}: {err}");
    127
}

fn confine() -> Result<(), String> {
    use landlock::{
        make_bitflags, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope, ABI,
    };
    // Every right used here is required: a kernel short of one fails, never weakens.
    let abi = ABI::V6;
    let writable_devices: Vec<&str> = ["/dev/null", "/dev/tty", "/dev/pts", "/dev/ptmx"]
        .into_iter()
        .filter(|p| Path::new(p).exists())
        .collect();
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::BindTcp))
        .and_then(|r| r.scope(make_bitflags!(Scope::{Signal | AbstractUnixSocket})))
        .and_then(|r| r.create())
        .and_then(|r| {
            r.add_rules(landlock::path_beneath_rules(
                ["/"],
                AccessFs::from_read(abi),
            ))
        })
        .and_then(|r| {
            r.add_rules(landlock::path_beneath_rules(
                writable_devices,
                AccessFs::from_read(abi) | AccessFs::WriteFile | AccessFs::IoctlDev,
            ))
        })
        .and_then(|r| r.restrict_self())
        .map_err(|e| e.to_string())?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(()),
        other => Err(format!("the rules were enforced only {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_read_back_as_written_and_a_broken_one_is_refused() {
        let frames = [
            Frame::Input(b"ls -la\r".to_vec()),
            Frame::Resize(WindowSize {
                rows: 30,
                cols: 100,
            }),
            Frame::Output(vec![0, 255, 10]),
            Frame::Exit(-1),
            Frame::Input(Vec::new()),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut from = wire.as_slice();
        for frame in &frames {
            assert_eq!(Frame::read(&mut from).await.unwrap().as_ref(), Some(frame));
        }
        assert_eq!(Frame::read(&mut from).await.unwrap(), None, "a clean end");
        // A resize of the wrong length, an unknown kind, a frame past the bound, and
        // one cut short are errors, not frames.
        for broken in [
            vec![1, 0, 0, 0, 2, 0, 1],
            vec![9, 0, 0, 0, 0],
            vec![0, 0x7f, 0xff, 0xff, 0xff],
            vec![0, 0, 0, 0, 5, b'a'],
        ] {
            assert!(
                Frame::read(&mut broken.as_slice()).await.is_err(),
                "{broken:?}"
            );
        }
    }

    #[test]
    fn a_terminal_type_is_kept_only_when_it_is_plain() {
        let of = |term: &str| {
            term_of(&ShellRequest {
                size: WindowSize::default(),
                term: Some(term.into()),
                read_only: false,
                line_editing: true,
            })
        };
        assert_eq!(of("screen-256color"), "screen-256color");
        assert_eq!(of("xterm; rm -rf /"), "xterm-256color");
        assert_eq!(of(""), "xterm-256color");
    }
}
