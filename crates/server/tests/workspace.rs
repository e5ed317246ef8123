//! A workspace in and out through the API: seeded with text and binary files at
//! creation, or uploaded as a tar archive of a real repository (binary files past the
//! body limit, links, a FIFO, `.git`, `node_modules`); changed by the agent, and
//! downloaded as a tar archive at any log position, which the system's `tar` unpacks
//! to exactly what the workspace held then. Hostile archives are refused whole.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use common::{assert_error, call, dev, server, wait_status};
use serde_json::json;

/// Every path under `dir` with what it is: file bytes and exec bit, link target, dir.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    for entry in walkdir::WalkDir::new(dir).min_depth(1) {
        let entry = entry.unwrap();
        let path = entry
            .path()
            .strip_prefix(dir)
            .unwrap()
            .display()
            .to_string();
        let meta = entry.path().symlink_metadata().unwrap();
        use std::os::unix::fs::FileTypeExt as _;
        let what = if meta.file_type().is_fifo() {
            "fifo".into()
        } else if meta.file_type().is_symlink() {
            format!("-> {}", std::fs::read_link(entry.path()).unwrap().display())
        } else if meta.is_dir() {
            "dir".into()
        } else {
            let exec = meta.permissions().mode() & 0o111 != 0;
            let bytes = std::fs::read(entry.path()).unwrap();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            std::hash::Hash::hash(&bytes, &mut hasher);
            let digest = std::hash::Hasher::finish(&hasher);
            format!("{exec} {} bytes {digest:016x}", bytes.len())
        };
        out.insert(path, what);
    }
    out
}

/// Downloads the archive at `query` and unpacks it with the system's tar.
async fn unpack(url: &str, into: &Path) -> (String, String) {
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
    let disposition = resp.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_string();
    let bytes = resp.bytes().await.unwrap();
    std::fs::create_dir_all(into).unwrap();
    let archive = into.with_extension("tar");
    std::fs::write(&archive, &bytes).unwrap();
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(status.success(), "tar unpacks it");
    (kind, disposition)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_binary_files_come_back_in_the_archive_at_every_position() {
    let srv = server(
        json!([
            {"text": "changing things", "tool_calls": [{"name": "bash", "input": {"command":
                "chmod +x run.sh && ln -s notes.txt latest && mkdir -p out/empty && printf 'two\\n' >> notes.txt && rm old.txt"}}]},
            {"text": "done"}
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&binary);
    let sessions = format!("{}/v1/sessions", srv.url);

    // Bad base64 is refused, naming the file, and leaves nothing behind.
    let refused = call(
        reqwest::Method::POST,
        &sessions,
        None,
        Some(json!({"workspace": {"kind": "empty", "files": {"img.bin": {"base64": "not base64!"}}}})),
    )
    .await;
    assert_error(&refused, 422, "invalid_body");
    assert!(refused.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("img.bin"));

    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        None,
        Some(
            json!({"task": "change things", "workspace": {"kind": "empty", "files": {
                "notes.txt": "one\n",
                "old.txt": "going\n",
                "run.sh": "#!/bin/sh\necho run\n",
                "assets/img.bin": {"base64": encoded},
            }}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let workspace = srv.workspace(&created);
    assert_eq!(
        std::fs::read(workspace.join("assets/img.bin")).unwrap(),
        binary
    );
    let before = tree(&workspace);
    wait_status(&srv.url, id, None, "idle").await;
    let after = tree(&workspace);
    assert_ne!(before, after);

    let dir = tempfile::tempdir().unwrap();
    let archive = format!("{sessions}/{id}/archive");
    let (kind, disposition) = unpack(&format!("{archive}?at=0"), &dir.path().join("then")).await;
    assert_eq!(kind, "application/x-tar");
    assert_eq!(disposition, format!("attachment; filename=\"{id}-0.tar\""));
    assert_eq!(
        tree(&dir.path().join("then")),
        before,
        "as the session began"
    );
    unpack(&archive, &dir.path().join("now")).await;
    assert_eq!(tree(&dir.path().join("now")), after, "as it is now");
    assert!(after["run.sh"].starts_with("true"), "{after:?}");
    assert_eq!(after["latest"], "-> notes.txt");

    // Positions past the log's end, and other owners' sessions, are refused.
    let past = call(
        reqwest::Method::GET,
        &format!("{archive}?at=99999"),
        None,
        None,
    )
    .await;
    assert_eq!(past.0, 422, "{past:?}");
    let missing = call(
        reqwest::Method::GET,
        &format!("{sessions}/ses_nobody/archive"),
        None,
        None,
    )
    .await;
    assert_error(&missing, 404, "session_not_found");
}

fn run(dir: &Path, program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn upload(url: &str, kind: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/uploads"))
        .header("content-type", kind)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// The answer to an upload that declares `length` bytes and sends none of them: a
/// body declared too large must be refused from its headers alone (a client sending the
/// whole body could see its connection cut before it reads the answer).
async fn declared_upload(url: &str, length: usize) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/uploads HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-tar\r\n\
         content-length: {length}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("the server answers without waiting for the body")
    .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A tar archive with one entry whose name is given raw (as a hostile one may be).
fn hostile(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, kind, link) in entries {
        let mut header = tar::Header::new_gnu();
        header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        header.as_gnu_mut().unwrap().linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        header.set_size(1);
        header.set_cksum();
        tar.append(&header, &b"x"[..]).unwrap();
    }
    tar.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_repository_becomes_the_workspace_byte_for_byte() {
    let srv = server(
        json!([
            {"text": "looking", "tool_calls": [{"name": "bash", "input": {"command":
                "git status --porcelain > ../status.txt; git log --oneline | wc -l > ../commits.txt; echo changed >> README.md"}}]},
            {"text": "done"}
        ]),
        dev(),
        1,
        |state| state.max_upload = 4 << 20,
    )
    .await;
    // A real repository: history, a 1 MiB binary (four times the body limit), an
    // executable, links, a FIFO and node_modules.
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(repo.join("node_modules/left-pad")).unwrap();
    std::fs::write(repo.join("README.md"), "# project\n").unwrap();
    std::fs::write(
        repo.join("node_modules/left-pad/index.js"),
        "module.exports = 1;\n",
    )
    .unwrap();
    let mut noise = Vec::with_capacity(1 << 20);
    let mut x = 0x2545_f491_u32;
    while noise.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(repo.join("model.bin"), &noise).unwrap();
    // Last modified in 2001: the time comes back in the workspace and the archive.
    let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(repo.join("model.bin"))
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    std::fs::write(repo.join("build.sh"), "#!/bin/sh\necho build\n").unwrap();
    run(&repo, "chmod", &["+x", "build.sh"]);
    std::os::unix::fs::symlink("README.md", repo.join("readme-link")).unwrap();
    run(&repo, "git", &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join(".gitignore"), "node_modules/\nevents\n").unwrap();
    run(&repo, "git", &["add", "-A"]);
    run(
        &repo,
        "git",
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-qm",
            "one",
        ],
    );
    run(
        &repo,
        "git",
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "two",
        ],
    );
    run(&repo, "mkfifo", &["events"]);
    let archive = dir.path().join("repo.tgz");
    run(
        dir.path(),
        "tar",
        &[
            "czf",
            archive.to_str().unwrap(),
            "-C",
            repo.to_str().unwrap(),
            ".",
        ],
    );
    let before = tree(&repo);

    let (status, uploaded) = upload(
        &srv.url,
        "application/gzip",
        std::fs::read(&archive).unwrap(),
    )
    .await;
    assert_eq!(status, 201, "{uploaded}");
    let id = uploaded["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("upl_"));
    let sessions = format!("{}/v1/sessions", srv.url);
    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        None,
        Some(json!({"workspace": {"kind": "upload", "upload": id}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let session = created["id"].as_str().unwrap();
    let workspace = srv.workspace(&created);
    let unpacked = tree(&workspace);
    let differ: Vec<String> = before
        .iter()
        .filter(|(k, v)| unpacked.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: {v} / {:?}", unpacked.get(k)))
        .chain(
            unpacked
                .keys()
                .filter(|k| !before.contains_key(*k))
                .map(|k| format!("{k}: only unpacked")),
        )
        .collect();
    assert!(
        differ.is_empty(),
        "the workspace is the archive's tree: {differ:?}"
    );
    let (status, _) = call(
        reqwest::Method::POST,
        &format!("{sessions}/{session}/messages"),
        None,
        Some(json!({"text": "look"})),
    )
    .await;
    assert_eq!(status, 200);
    for _ in 0..600 {
        let shown = wait_status(&srv.url, session, None, "idle").await;
        if shown["turn"] == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // The agent saw a clean repository with its history.
    let parent = workspace.parent().unwrap();
    assert_eq!(
        std::fs::read_to_string(parent.join("status.txt")).unwrap(),
        ""
    );
    assert_eq!(
        std::fs::read_to_string(parent.join("commits.txt"))
            .unwrap()
            .trim(),
        "2"
    );
    // One file as it was at the start, byte for byte, and the whole tree then.
    let resp = reqwest::get(format!("{sessions}/{session}/files/model.bin?at=1"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().to_vec(), noise);
    let out = tempfile::tempdir().unwrap();
    unpack(
        &format!("{sessions}/{session}/archive?at=1"),
        &out.path().join("then"),
    )
    .await;
    assert_eq!(tree(&out.path().join("then")), before);
    let modified = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(modified(&workspace.join("model.bin")), long_ago);
    assert_eq!(
        modified(&out.path().join("then/model.bin")),
        long_ago,
        "the archive dates a file as it was last modified"
    );

    // Refused, naming the field, leaving no workspace: archives that reach outside or
    // make devices, ids of nothing; over the limit, not an archive's type, empty.
    let workspaces = workspace.parent().unwrap().to_path_buf();
    let count = || std::fs::read_dir(&workspaces).unwrap().count();
    let made = count();
    for (archive, says) in [
        (
            hostile(&[("../escape", tar::EntryType::Regular, "")]),
            "outside",
        ),
        (
            hostile(&[
                ("out", tar::EntryType::Symlink, "/tmp"),
                ("out/planted", tar::EntryType::Regular, ""),
            ]),
            "planted",
        ),
        (hostile(&[("tty", tar::EntryType::Char, "")]), "device"),
        (
            b"plain text, not a tar archive: nothing in it has a tar header at all....".repeat(9),
            "tar",
        ),
    ] {
        let (status, up) = upload(&srv.url, "application/x-tar", archive).await;
        assert_eq!(status, 201, "{up}");
        let refused = call(
            reqwest::Method::POST,
            &sessions,
            None,
            Some(json!({"workspace": {"kind": "upload", "upload": up["id"]}})),
        )
        .await;
        assert_error(&refused, 422, "invalid_body");
        let message = refused.1["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("workspace.upload") && message.contains(says),
            "{message}"
        );
    }
    assert!(!Path::new("/tmp/planted").exists());
    for id in ["upl_nothing", &format!("upl_{}", "0".repeat(64))] {
        let refused = call(
            reqwest::Method::POST,
            &sessions,
            None,
            Some(json!({"workspace": {"kind": "upload", "upload": id}})),
        )
        .await;
        assert_error(&refused, 422, "invalid_body");
    }
    assert_eq!(count(), made, "a refused session leaves no workspace");
    let refused = declared_upload(&srv.url, 5 << 20).await;
    assert!(
        refused.starts_with("HTTP/1.1 413") && refused.contains("\"body_too_large\""),
        "over the operator's upload limit, refused before a byte of the body: {refused}"
    );
    let (status, _) = upload(&srv.url, "text/plain", b"x".to_vec()).await;
    assert_eq!(status, 415);
    let (status, _) = upload(&srv.url, "application/x-tar", Vec::new()).await;
    assert_eq!(status, 422);
}
