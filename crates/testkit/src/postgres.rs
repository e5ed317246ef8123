//! A PostgreSQL server of a test's own: `initdb` into a temporary directory, its own
//! port on loopback, stopped and removed when dropped.
//!
//! Tests that do something to the server itself (restart it, cut its connections) use
//! one, never the machine's: on a developer's laptop that is their database, and on a
//! shared machine other users' connections would see it go.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A private PostgreSQL server (trust authentication, user `postgres`, on
/// `127.0.0.1:port` and a socket in its data directory).
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

/// What a private server speaks TLS with.
pub struct Tls {
    /// The server's certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM).
    pub key_pem: String,
    /// Whether connections over TCP must be encrypted (`hostssl` only).
    pub required: bool,
}

/// Why a private server could not be started: which step failed and what it printed.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// The directory of the newest installed server's programs (`initdb`, `pg_ctl`).
fn server_bin() -> Result<PathBuf, StartError> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| StartError(format!("no PostgreSQL server installed: {e}")))?
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| StartError("no initdb under /usr/lib/postgresql".into()))
}

/// Whether this process runs as root (PostgreSQL refuses to run as root, so the server
/// then runs as the `postgres` user).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

/// A port free on loopback at the time of asking.
fn free_port() -> Result<u16, StartError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| StartError(format!("no free port: {e}")))
}

impl PrivatePostgres {
    /// Creates a cluster in a new temporary directory and starts it.
    pub fn start() -> Result<Self, StartError> {
        Self::start_with(None)
    }

    /// Creates a cluster that speaks TLS with `tls` and starts it.
    pub fn start_with_tls(tls: &Tls) -> Result<Self, StartError> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&Tls>) -> Result<Self, StartError> {
        let bin = server_bin()?;
        let dir = tempfile::Builder::new()
            .prefix("steadfast-test-pg-")
            .tempdir()
            .map_err(|e| StartError(format!("temporary directory: {e}")))?;
        if is_root() {
            run(Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path()))?;
        }
        let mut server = Self { port: 0, bin, dir };
        let data = server.data();
        run(server
            .as_owner(&server.bin.join("initdb"))
            .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
            .arg(&data))?;
        if let Some(tls) = tls {
            server.configure_tls(tls)?;
        }
        // A port taken between asking and binding is tried again with another.
        let mut attempts = 0;
        loop {
            server.port = free_port()?;
            match server.pg_ctl(&["start"]) {
                Ok(()) => return Ok(server),
                Err(e) if attempts >= 4 => {
                    return Err(StartError(format!("{e}\nserver log:\n{}", server.log())))
                }
                Err(_) => attempts += 1,
            }
        }
    }

    /// Puts the certificate and key in the data directory, turns TLS on and, if asked,
    /// refuses every TCP connection that is not encrypted (the socket stays open, for
    /// [`Self::socket_url`]).
    fn configure_tls(&self, tls: &Tls) -> Result<(), StartError> {
        let data = self.data();
        let write = |name: &str, text: &str| {
            std::fs::write(data.join(name), text)
                .map_err(|e| StartError(format!("writing {name}: {e}")))
        };
        write("server.crt", &tls.cert_pem)?;
        write("server.key", &tls.key_pem)?;
        let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap_or_default();
        conf.push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        write("postgresql.conf", &conf)?;
        if tls.required {
            write(
                "pg_hba.conf",
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
            )?;
        }
        for name in ["server.crt", "server.key", "postgresql.conf", "pg_hba.conf"] {
            if is_root() {
                run(Command::new("chown")
                    .arg("postgres:postgres")
                    .arg(data.join(name)))?;
            }
        }
        run(Command::new("chmod")
            .arg("600")
            .arg(data.join("server.key")))
    }

    /// The URL of database `db` over the server's Unix socket (never encrypted, always
    /// allowed): for a test's own look at the server.
    pub fn socket_url(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db}",
            self.dir.path().display(),
            self.port
        )
    }

    /// The port the server listens on at 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command run as the cluster's owner.
    fn as_owner(&self, program: &Path) -> Command {
        if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), StartError> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={}",
            self.port,
            self.dir.path().display()
        );
        run(self
            .as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", "120", "-o", &options])
            .args(args))
    }

    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Restarts the server (a fast shutdown: open connections are cut), waiting until it
    /// accepts connections again.
    pub fn restart(&self) -> Result<(), StartError> {
        self.pg_ctl(&["restart", "-m", "fast"])
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `cmd`, its output kept for the error if it fails.
fn run(cmd: &mut Command) -> Result<(), StartError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| StartError(format!("{:?}: {e}", cmd.get_program())))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(StartError(format!(
            "{:?} {:?} failed ({}): {}{}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
