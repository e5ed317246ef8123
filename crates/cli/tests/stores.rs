//! The stores a deployment points at, as an operator meets them: PostgreSQL over TLS
//! as each `sslmode` says (a private server of the test's own that refuses
//! unencrypted connections), secrets never shown, stores checked at start, and the
//! readiness probe.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::json;
use steadfast_testkit::postgres::{PrivatePostgres, Tls};
use steadfast_testkit::{FakeProvider, Script};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// `openssl`, which must succeed.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl is installed (see .ci/run)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate authority of the test's own: its certificate's path.
fn authority(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
    dir.join(format!("{name}.pem"))
}

/// A server certificate for `host` signed by the authority `ca`: (certificate, key).
fn signed_for(dir: &Path, ca: &str, host: &str) -> (String, String) {
    std::fs::write(
        dir.join("server.ext"),
        format!("subjectAltName=DNS:{host}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={host}"),
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
    (
        std::fs::read_to_string(dir.join("server.crt")).unwrap(),
        std::fs::read_to_string(dir.join("server.key")).unwrap(),
    )
}

/// `steadfast` with `args` on the world `world`, in `home`.
fn steadfast(home: &Path, world: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("STEADFAST_HOME", home)
        .env("STEADFAST_WORLD", world)
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_BLOBS")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// How many of database `db`'s connections over TCP are encrypted, and how many are
/// not (seen over the server's socket).
async fn connections(pg: &PrivatePostgres, db: &str) -> (i64, i64) {
    let (client, conn) = tokio_postgres::connect(&pg.socket_url("postgres"), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = $1 AND a.client_addr IS NOT NULL",
            &[&db],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// `/readyz` of the server at `url`: ready with both stores, or a 503 naming `down`.
async fn assert_readiness(url: &str, down: Option<&str>) {
    let (status, ready) = common::call(reqwest::Method::GET, &format!("{url}/readyz"), None).await;
    match down {
        None => assert_eq!(
            (status, &ready["world"], &ready["blobs"]),
            (200, &json!("ok"), &json!("ok")),
            "{ready}"
        ),
        Some(store) => assert_eq!(
            (
                status,
                &ready["error"]["code"],
                ready["error"]["message"].as_str()
            ),
            (
                503,
                &json!("not_ready"),
                Some(format!("not ready: {store} unavailable").as_str())
            ),
            "{ready}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_over_tls_as_sslmode_says() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let ca = authority(&certs, "ca");
    let stranger = authority(&certs, "stranger");
    // The certificate names another host than the one connected to (127.0.0.1), so
    // verify-full refuses it where verify-ca takes it.
    let (cert_pem, key_pem) = signed_for(&certs, "ca", "db.internal");
    let pg = tokio::task::spawn_blocking(move || {
        PrivatePostgres::start_with_tls(&Tls {
            cert_pem,
            key_pem,
            required: true,
        })
    })
    .await
    .unwrap()
    .expect("a private PostgreSQL server with TLS starts");
    let base = pg.url("postgres");
    let home = dir.path().join("home");
    let with = |query: String| format!("{base}?{query}");
    let root = |pem: &Path| format!("sslrootcert={}", pem.display());

    let migrated = steadfast(
        &home,
        &with(format!("sslmode=verify-ca&{}", root(&ca))),
        &["migrate"],
    );
    assert!(migrated.status.success(), "{}", common::stderr(&migrated));

    for (query, works, says) in [
        ("sslmode=disable".to_string(), false, "no encryption"),
        ("sslmode=prefer".to_string(), true, ""),
        (String::new(), true, ""), // libpq's default: prefer
        ("sslmode=require".to_string(), true, ""),
        (format!("sslmode=verify-ca&{}", root(&ca)), true, ""),
        (
            format!("sslmode=verify-full&{}", root(&ca)),
            false,
            "not valid for name",
        ),
        (
            format!("sslmode=verify-ca&{}", root(&stranger)),
            false,
            "UnknownIssuer",
        ),
        // With a root given, require checks the issuer as libpq does.
        (
            format!("sslmode=require&{}", root(&stranger)),
            false,
            "UnknownIssuer",
        ),
        (
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem".to_string(),
            false,
            "/nonexistent/ca.pem",
        ),
    ] {
        let out = steadfast(&home, &with(query.clone()), &["sessions"]);
        let err = common::stderr(&out);
        assert_eq!(out.status.success(), works, "{query}: {err}");
        assert!(
            err.contains(says),
            "{query}: the error names its cause: {err}"
        );
    }
    // A key=value connection string is read the same way.
    let pairs = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-ca {}",
        pg.port(),
        root(&ca)
    );
    let out = steadfast(&home, &pairs, &["sessions"]);
    assert!(out.status.success(), "{}", common::stderr(&out));

    // A server and worker on it: the pool and the notification connection are both
    // encrypted, and a session runs through.
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Writing it.", "tool_calls": [{"name": "bash", "input": {"command": "echo over-tls > done.txt"}}]},
        {"text": "Done."}
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let world = with(format!("sslmode=verify-ca&{}", root(&ca)));
    let mut serve = common::service(
        &home,
        &fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
    )
    .env("STEADFAST_WORLD", &world)
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut serve).await;
    let (status, created) = common::call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"task": "write done.txt", "workspace": {"kind": "empty"}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    common::wait_for("the session over TLS to finish its turn", async || {
        let (_, s) = common::call(
            reqwest::Method::GET,
            &format!("{url}/v1/sessions/{id}"),
            None,
        )
        .await;
        s["status"] == "idle"
    })
    .await;
    let (encrypted, plain) = connections(&pg, "postgres").await;
    assert_eq!(plain, 0, "no connection of the server's is unencrypted");
    assert!(
        encrypted >= 2,
        "the pool and the LISTEN connection: {encrypted}"
    );
    assert_readiness(&url, None).await;

    // The database goes: not ready, naming the world, but alive.
    drop(pg);
    assert_readiness(&url, Some("world")).await;
    let live = reqwest::get(format!("{url}/livez")).await.unwrap();
    assert_eq!(live.status(), 200);
    let _ = serve.kill().await;
}

#[tokio::test]
async fn a_database_password_is_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let secret = "Sh0uld-N3ver-Appear";
    let world = format!(
        "postgres://postgres:{secret}@127.0.0.1:5432/steadfast_no_such_database_{}",
        std::process::id()
    );
    let out = steadfast(&home, &world, &["sessions"]);
    let err = common::stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(!err.contains(secret), "{err}");
    assert!(err.contains("does not exist"), "the cause is named: {err}");
    assert!(err.contains("postgres:***@127.0.0.1"), "{err}");
    let dumped = steadfast(&home, &world, &["config", "--dump"]);
    let text = String::from_utf8_lossy(&dumped.stdout);
    assert!(dumped.status.success());
    assert!(!text.contains(secret), "{text}");
    assert!(text.contains("postgres:***@"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_store_that_cannot_be_used_is_named_at_start_and_by_readyz() {
    let moto = common::Moto::start("present");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let fake = FakeProvider::start(Script::default()).await.unwrap();
    let on_bucket = |bucket: &str, args: &[&str]| {
        let mut cmd = common::service(&home, &fake, args);
        cmd.env("STEADFAST_BLOBS", format!("s3://{bucket}/steadfast"))
            .env("AWS_ENDPOINT", &moto.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .stderr(Stdio::piped());
        cmd
    };
    for args in [
        &["serve", "--listen", "127.0.0.1:0"][..],
        &["worker", "--metrics-listen", "127.0.0.1:0"][..],
    ] {
        let out = tokio::time::timeout(Duration::from_secs(60), on_bucket("absent", args).output())
            .await
            .expect("it stops at once")
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} refused to start");
        assert!(
            err.contains("s3://absent/steadfast") && err.contains("cannot be written"),
            "{args:?}: {err}"
        );
    }
    let mut serve = on_bucket(
        "present",
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut serve).await;
    assert_readiness(&url, None).await;
    let (_, ready) = common::call(reqwest::Method::GET, &format!("{url}/readyz"), None).await;
    assert_eq!(
        ready["sandbox"], "not_used",
        "an API-only server runs no commands"
    );
    drop(moto);
    assert_readiness(&url, Some("blobs")).await;
    let _ = serve.kill().await;
}

/// A home whose `world.db` was deleted while its drive and workspaces remain is not
/// taken for a new home: the command fails and names the missing file, and nothing is
/// made over it. A new home still gets its world.
#[test]
fn a_deleted_world_file_is_reported_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join("drive").join("objects")).unwrap();
    std::fs::write(home.join("drive").join("objects").join("ab"), b"x").unwrap();
    let out = steadfast(&home, "", &["sessions"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("world.db is missing"), "{said}");
    assert!(
        !home.join("world.db").exists(),
        "no empty world was made over it"
    );

    let fresh = dir.path().join("fresh");
    let out = steadfast(&fresh, "", &["sessions"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A worker's readiness includes the sandbox backend it was configured with: where
/// `bwrap` cannot start a sandbox, its `/readyz` is a 503 naming the sandbox (the
/// worker itself is alive), while a worker whose backend works is ready.
#[tokio::test]
async fn a_worker_whose_sandbox_cannot_start_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken-bin");
    std::fs::create_dir_all(&broken).unwrap();
    let fake_bwrap = broken.join("bwrap");
    std::fs::write(&fake_bwrap, "#!/bin/sh\necho 'no namespaces' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(
        &fake_bwrap,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let fake = FakeProvider::start(Script::default()).await.unwrap();
    let path = std::env::var("PATH").unwrap();
    for (case, bin_path, expected) in [
        (
            "a bwrap that fails",
            format!("{}:{path}", broken.display()),
            503,
        ),
        ("a working bwrap", path.clone(), 200),
    ] {
        let home = dir.path().join(case.replace(' ', "-"));
        let metrics = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let _worker = common::service(&home, &fake, &["worker", "--metrics-listen", &metrics])
            .env("STEADFAST_SANDBOX", "bwrap")
            .env("PATH", &bin_path)
            .spawn()
            .unwrap();
        let url = format!("http://{metrics}/readyz");
        let mut answer = None;
        for _ in 0..300 {
            if let Ok(resp) = reqwest::get(&url).await {
                let status = resp.status().as_u16();
                answer = Some((status, resp.json::<serde_json::Value>().await.unwrap()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (status, body) = answer.expect("the worker's listener answers");
        assert_eq!(status, expected, "{case}: {body}");
        if expected == 503 {
            assert_eq!(body["error"]["code"], "not_ready", "{body}");
            assert_eq!(
                body["error"]["message"], "not ready: sandbox unavailable",
                "{body}"
            );
        } else {
            assert_eq!(body["sandbox"], "ok", "{case}: {body}");
        }
    }
}
