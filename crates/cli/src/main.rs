//! `steadfast`: run durable coding-agent sessions from the command line.

mod commands;
mod config;
mod home;
mod remote;
mod render;
mod setup;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Durable coding agents: kill the process at any instant, resume with nothing paid
/// twice, nothing run twice and nothing lost.
#[derive(Debug, Parser)]
#[command(name = "steadfast", version, about)]
struct Cli {
    /// Where sessions, blobs and snapshots are kept (default: the nearest `.steadfast`
    /// here or above, else the per-user `~/.local/share/steadfast`).
    #[arg(long, global = true, env = "STEADFAST_HOME")]
    home: Option<PathBuf>,
    /// The configuration file (default: `steadfast.toml` here, if present).
    #[arg(long, global = true, env = "STEADFAST_CONFIG")]
    config: Option<PathBuf>,
    /// Where sessions live: `postgres://...` or `sqlite:PATH` (default: the embedded
    /// SQLite world under --home).
    #[arg(long, global = true, env = "STEADFAST_WORLD")]
    world: Option<String>,
    /// Apply pending PostgreSQL migrations when opening the world.
    #[arg(long, global = true, env = "STEADFAST_MIGRATE")]
    migrate: bool,
    /// Where big outputs go: `s3://bucket/prefix` or a directory (default: blobs/
    /// under --home).
    #[arg(long, global = true, env = "STEADFAST_BLOBS")]
    blobs: Option<String>,
    /// Where this host materializes the logical workspaces of sessions it drives
    /// (default: workspaces/ under --home).
    #[arg(long, global = true, env = "STEADFAST_WORKSPACE_ROOT")]
    workspace_root: Option<PathBuf>,
    /// The sandbox backend: `auto` (bwrap where it works, else local with a warning),
    /// `bwrap` or `local`.
    #[arg(long, global = true, env = "STEADFAST_SANDBOX")]
    sandbox: Option<String>,
    /// The sandbox's network: `deny-all` (default), `open`, or
    /// `allow:host[:port],*.domain,...` (through an egress proxy).
    #[arg(long, global = true, env = "STEADFAST_NETWORK", value_parser = steadfast_log::NetworkPolicy::parse)]
    network: Option<steadfast_log::NetworkPolicy>,
    /// A Steadfast server to read and control sessions through (its HTTP API, as the
    /// token's owner), instead of opening the world here: `sessions`, `log`, `diff`,
    /// `stop`, `close`, `delete`, `signal` and `send`. The token comes from
    /// `STEADFAST_TOKEN` or `--token-file`.
    #[arg(long, global = true, env = "STEADFAST_SERVER", value_name = "URL")]
    server: Option<String>,
    /// A file holding the bearer token for `--server`.
    #[arg(long, global = true, env = "STEADFAST_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Log format for diagnostics on stderr: `text` or `json`.
    #[arg(
        long,
        global = true,
        env = "STEADFAST_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a session on a task and drive it to the end.
    Run(commands::run::RunArgs),
    /// Carry on a session from its log after a crash or stop.
    Resume(commands::run::ResumeArgs),
    /// List sessions.
    Sessions(commands::sessions::SessionsArgs),
    /// Show a session's log as a timeline (`--follow` to keep watching).
    Log(commands::log::LogArgs),
    /// What a session changed in its workspace, as content diffs (`--from N --to M`
    /// for the changes between two log positions).
    Diff(commands::manage::DiffArgs),
    /// Serve the fake model provider (Anthropic and OpenAI wire formats) on loopback.
    FakeProvider(commands::fake::FakeArgs),
    /// Measure the journal and wake costs against baselines, in one run.
    Bench(commands::bench::BenchArgs),
    /// Serve the HTTP API, with workers taking turns.
    Serve(commands::serve::ServeArgs),
    /// Run workers only: take turns from the world's queue and drive them.
    Worker(commands::serve::WorkerArgs),
    /// Queue a message for a session's next turn (or `--steer` its running one), for
    /// whichever process drives it.
    Send(commands::manage::SendArgs),
    /// Fork a session at any log position: new sessions whose history is its own up
    /// to there (shared, not copied) and whose workspace is the snapshot recorded there.
    Fork(commands::manage::ForkArgs),
    /// Rewind a session to an earlier turn's end: its workspace is put back and the
    /// model's context is the history up to there; what followed is kept in a fork.
    Rewind(commands::manage::RewindArgs),
    /// Move a wrapped session to another CLI version or named agent, between turns
    /// (recorded; try it first with `replay --agent`).
    Upgrade(commands::manage::UpgradeArgs),
    /// Replay a wrapped agent's recorded session with another CLI version, named
    /// agent or model, answered from its log with no provider call, and report the
    /// first model request that differs, with a diff (`--continue` to go on live).
    Replay(commands::replay::ReplayArgs),
    /// Deliver a named signal to a session (e.g. `approval '{"approved": true}'`).
    Signal(commands::manage::SignalArgs),
    /// A session's inbound hooks (`--server`): URLs a third party (CI, GitHub, Slack)
    /// posts to, answering its wait or starting a turn, without the owner's token.
    Hooks(commands::remote::HooksArgs),
    /// What listens in a session's sandbox, with each port's preview URL (`--server`):
    /// HTTP and WebSocket traffic to it reaches the program through the server.
    Ports {
        /// The session.
        session: String,
        /// Print the server's JSON answer as it is.
        #[arg(long)]
        json: bool,
        /// Instead, make a share link to this port: anyone with the printed URL may
        /// read what it serves (GET, HEAD, WebSockets) until it expires or is revoked.
        #[arg(long, value_name = "PORT", conflicts_with = "revoke")]
        share: Option<u16>,
        /// How long a share link works, in seconds.
        #[arg(long, default_value_t = 3600, requires = "share")]
        expires_in: u64,
        /// Instead, revoke the share link with this id (`pl_...`).
        #[arg(long, value_name = "LINK")]
        revoke: Option<String>,
    },
    /// Open a shell in a session's sandbox, in this terminal (`--server`): with its
    /// isolation and no credentials. Between turns it may write, and what you change
    /// is recorded in the log (`human_shell`) and told to the model with its next
    /// turn; while a turn runs it is read-only unless `--force` interrupts the turn.
    /// Ctrl-] detaches.
    Attach {
        /// The session.
        session: String,
        /// While a turn runs, interrupt it and open a writable shell.
        #[arg(long)]
        force: bool,
    },
    /// Stop a session's running turn at once, whichever process drives it: the model
    /// stream is cut or the command killed, and the session goes idle.
    Stop {
        /// The session.
        session: String,
    },
    /// End a session for good (completed), interrupting a running turn first; its log
    /// stays.
    Close {
        /// The session.
        session: String,
    },
    /// Remove a session (its log and outputs), interrupting a running turn first. The
    /// workspace is left where it is.
    Delete {
        /// The session.
        session: String,
    },
    /// Install a wrapped CLI agent's npm package: `claude-code` (its pinned version),
    /// `claude-code@2.1.332`, or a named agent (at its configured version).
    InstallAgent {
        /// The agent, optionally `@<version>`.
        name: String,
    },
    /// List the agents sessions can run (native, the wrapped CLIs, named agents) with
    /// their versions and whether each is installed.
    Agents {
        /// One JSON object per agent on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print the hash of a bearer token read from stdin (so it stays out of shell
    /// history and `ps`), for the `[server] tokens` configuration.
    HashToken,
    /// Seal every stored credential again under the current vault key
    /// (`STEADFAST_VAULT_KEY`), so keys in `STEADFAST_VAULT_OLD_KEYS` can be retired.
    RekeyVault,
    /// Print the API's OpenAPI document, the one `serve` answers at `/openapi.json`
    /// (to generate a client without a running server).
    Openapi,
    /// Apply pending database migrations (PostgreSQL worlds). Safe to run from many
    /// replicas at once (they take turns under a lock), as a one-shot deployment job.
    Migrate {
        /// Also make the blob store's S3 bucket if it is missing (a first deployment
        /// against an empty MinIO or other S3-compatible store).
        #[arg(long)]
        create_bucket: bool,
    },
    /// Print a completion script for `shell` (bash, zsh, fish, elvish, powershell),
    /// e.g. `steadfast completions bash > ~/.local/share/bash-completion/completions/steadfast`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Reclaim workspace snapshot objects that no session's log references.
    Gc(commands::gc::GcArgs),
    /// Print the effective configuration (`--dump`).
    Config {
        /// Print it as TOML.
        #[arg(long)]
        dump: bool,
    },
}

/// Runs a command through a server's API; commands that drive, serve or administer
/// the world here are refused (they need the world itself).
async fn on_server(remote: &remote::Remote, command: Command) -> anyhow::Result<ExitCode> {
    use commands::remote as on;
    match command {
        Command::Sessions(args) => on::sessions(remote, args).await,
        Command::Log(args) => on::log(remote, args).await,
        Command::Diff(args) => on::diff(remote, args).await,
        Command::Stop { session } => on::stop(remote, &session).await,
        Command::Close { session } => on::close(remote, &session).await,
        Command::Delete { session } => on::delete(remote, &session).await,
        Command::Signal(args) => on::signal(remote, args).await,
        Command::Hooks(args) => on::hooks(remote, args).await,
        Command::Ports {
            session,
            json,
            share,
            expires_in,
            revoke,
        } => match (share, revoke) {
            (Some(port), _) => on::share(remote, &session, port, expires_in).await,
            (None, Some(link)) => on::revoke_link(remote, &session, &link).await,
            (None, None) => on::ports(remote, &session, json).await,
        },
        Command::Attach { session, force } => {
            commands::attach::attach(remote, &session, force).await
        }
        Command::Send(args) => on::send(remote, args).await,
        Command::Fork(args) => on::fork(remote, args).await,
        Command::Rewind(args) => on::rewind(remote, args).await,
        Command::Upgrade(args) => on::upgrade(remote, args).await,
        Command::Resume(_) => anyhow::bail!(
            "--server: a server's workers carry sessions on; give one more to do with `send <session> \"<text>\"`"
        ),
        _ => anyhow::bail!(
            "--server: this command works on this machine's world, not through a server; drop --server (and STEADFAST_SERVER)"
        ),
    }
}

/// The exit code of a command line that does not parse (BSD `EX_USAGE`).
const EXIT_USAGE: u8 = 64;

/// A secret from stdin: its first line, without the line ending. On a terminal it
/// asks for it (the input is not hidden, but it stays out of history and `ps`).
fn read_secret() -> anyhow::Result<String> {
    use std::io::{BufRead, IsTerminal};
    if std::io::stdin().is_terminal() {
        eprint!("token: ");
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let token = line.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        anyhow::bail!("no token on stdin: echo -n \"$TOKEN\" | steadfast hash-token");
    }
    Ok(token.to_string())
}

fn main() -> ExitCode {
    // Inside a sandbox this program serves as its agent (see steadfast_sandbox::agent).
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("sandbox-agent") {
        return ExitCode::from(steadfast_sandbox::agent::main(args) as u8);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and --version go to stdout and succeed; a usage error has its own
            // exit code (EX_USAGE), apart from every outcome of a session.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    let service = matches!(cli.command, Command::Serve(_) | Command::Worker(_));
    let traces = setup::init_tracing(&cli.log_format, service);
    let home = home::Home::find(cli.home.clone());
    home::remember_invocation(&home);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("steadfast: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The command runs as a task on the runtime's workers, not on this thread: a future
    // driven by `block_on` wakes across threads for every reply its I/O tasks (database
    // connections, HTTP servers in this process) hand it, which on a small machine more
    // than doubled a fake-model step's wall time.
    let command = async move {
        let overrides = config::Overrides {
            world: cli.world.clone(),
            blobs: cli.blobs.clone(),
            workspace_root: cli.workspace_root.clone(),
            migrate: cli.migrate,
            sandbox: cli.sandbox.clone(),
            network: cli.network.clone(),
        };
        let config = config::Config::layered(cli.config.as_deref(), overrides)?;
        // Commands that only read or control sessions create no home: without one
        // there is nothing to find (a PostgreSQL world keeps sessions elsewhere).
        let existing = || -> anyhow::Result<&std::path::Path> {
            match config.world {
                None => home.require(),
                Some(_) => Ok(&home.path),
            }
        };
        let path = home.path.as_path();
        if let Some(server) = &cli.server {
            let remote = remote::Remote::new(server, cli.token_file.as_deref())?;
            return on_server(&remote, cli.command).await;
        }
        match cli.command {
            Command::Run(args) => commands::run::run(path, &config, args).await,
            Command::Resume(args) => commands::run::resume(existing()?, &config, args).await,
            Command::Config { .. } => {
                print!("{}", config.dump());
                Ok(ExitCode::SUCCESS)
            }
            Command::Sessions(args) => match existing() {
                Ok(path) => commands::sessions::run(path, &config, args).await,
                Err(e) => {
                    eprintln!("steadfast: no sessions: {e:#}");
                    Ok(ExitCode::SUCCESS)
                }
            },
            Command::Log(args) => commands::log::run(existing()?, &config, args).await,
            Command::Diff(args) => commands::manage::diff(existing()?, &config, args).await,
            Command::Serve(args) => commands::serve::serve(path, &config, args).await,
            Command::Worker(args) => commands::serve::worker(path, &config, args).await,
            Command::Signal(args) => commands::manage::signal(existing()?, &config, args).await,
            Command::Send(args) => commands::manage::send(existing()?, &config, args).await,
            Command::Fork(args) => commands::manage::fork(existing()?, &config, args).await,
            Command::Rewind(args) => commands::manage::rewind(existing()?, &config, args).await,
            Command::Upgrade(args) => commands::manage::upgrade(existing()?, &config, args).await,
            Command::Replay(args) => commands::replay::replay(existing()?, &config, args).await,
            Command::Stop { session } => {
                commands::manage::stop(existing()?, &config, &session).await
            }
            Command::Close { session } => {
                commands::manage::close(existing()?, &config, &session).await
            }
            Command::Delete { session } => {
                commands::manage::delete(existing()?, &config, &session).await
            }
            Command::InstallAgent { name } => {
                commands::wrapped::install(path, &config, &name).await
            }
            Command::Agents { json } => commands::wrapped::list(path, &config, json),
            Command::Hooks(_) => anyhow::bail!(
                "hooks are served by a server: give its address with --server URL (or STEADFAST_SERVER)"
            ),
            Command::Attach { .. } => anyhow::bail!(
                "a shell is opened through a server: give its address with --server URL (or STEADFAST_SERVER)"
            ),
            Command::Ports { .. } => anyhow::bail!(
                "preview URLs are served by a server: give its address with --server URL (or STEADFAST_SERVER)"
            ),
            Command::HashToken => {
                let token = read_secret()?;
                println!("{}", steadfast_server::hash_token(&token));
                Ok(ExitCode::SUCCESS)
            }
            Command::RekeyVault => commands::manage::rekey_vault(existing()?, &config).await,
            Command::Openapi => {
                print!("{}", steadfast_server::openapi::document());
                Ok(ExitCode::SUCCESS)
            }
            Command::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(shell, &mut command, "steadfast", &mut std::io::stdout());
                Ok(ExitCode::SUCCESS)
            }
            Command::Gc(args) => commands::gc::run(path, &config, args).await,
            Command::Migrate { create_bucket } => {
                let world = setup::world(path, &config, true).await?;
                world.migrate().await?;
                eprintln!("steadfast: {} is up to date", world.describe().await?);
                if create_bucket {
                    setup::create_bucket(path, &config).await?;
                }
                Ok(ExitCode::SUCCESS)
            }
            Command::FakeProvider(args) => commands::fake::run(args).await,
            Command::Bench(args) => commands::bench::run(args, &config).await,
        }
    };
    let result = match runtime.block_on(runtime.spawn(command)) {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(anyhow::anyhow!("the command was cancelled: {e}")),
    };
    // Work stuck in a blocking call (a snapshot of a hung filesystem, say) must not
    // keep the process alive once the command is over.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    // Sends the spans still batched.
    if let Some(traces) = traces {
        let _ = traces.shutdown();
    }
    match result {
        Ok(code) => code,
        // A closed pipe (`steadfast log ... | head`) is the reader's choice, not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("steadfast: {e:#}");
            ExitCode::FAILURE
        }
    }
}
