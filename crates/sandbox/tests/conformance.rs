//! The tool contract ([`steadfast_sandbox::conformance`]) on every backend this host
//! can run: `local` and `bwrap`.

use std::path::Path;
use std::sync::Arc;

use steadfast_sandbox::conformance::{self, CAPPED_OUTPUT};
use steadfast_sandbox::{Backend, BwrapSandbox, LocalSandbox, SandboxOptions};

fn bwrap_options() -> SandboxOptions {
    SandboxOptions {
        agent: vec![env!("CARGO_BIN_EXE_steadfast-sandbox-agent").to_string()],
        backend: Backend::Bwrap,
        ..SandboxOptions::default()
    }
}

fn local(ws: &Path, options: SandboxOptions) -> LocalSandbox {
    LocalSandbox::new(ws, options).unwrap()
}

fn bwrap(ws: &Path, options: SandboxOptions) -> BwrapSandbox {
    BwrapSandbox::new(ws, &options).unwrap()
}

/// One contract case on both backends, each over a workspace of its own.
macro_rules! on_every_backend {
    ($name:ident, |$sb:ident, $root:ident, $ws:ident| $body:expr) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn local() {
                let dir = tempfile::tempdir().unwrap();
                let ($root, $ws) = (dir.path(), conformance::lay_out(dir.path()));
                let $sb = super::local(&$ws, SandboxOptions::default());
                $body
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bwrap() {
                let dir = tempfile::tempdir().unwrap();
                let ($root, $ws) = (dir.path(), conformance::lay_out(dir.path()));
                let $sb = super::bwrap(&$ws, bwrap_options());
                $body
            }
        }
    };
}

on_every_backend!(paths_stay_inside, |sb, root, _ws| {
    conformance::paths_stay_inside(&sb, root).await
});
on_every_backend!(read_pages, |sb, _root, _ws| conformance::read_pages(&sb)
    .await);
on_every_backend!(edit_is_exact, |sb, _root, ws| {
    conformance::edit_is_exact(&sb, &ws).await
});
on_every_backend!(glob_and_grep_find_files, |sb, _root, _ws| {
    conformance::glob_and_grep_find_files(&sb).await
});
on_every_backend!(bash_reports_exit_codes, |sb, _root, _ws| {
    conformance::bash_reports_exit_codes(&sb).await
});
on_every_backend!(big_files_are_read_in_part, |sb, _root, ws| {
    conformance::big_files_are_read_in_part(&sb, &ws).await
});
on_every_backend!(special_files_never_block, |sb, _root, ws| {
    let sb = Arc::new(sb);
    tokio::task::spawn_blocking(move || conformance::special_files_never_block(sb, &ws))
        .await
        .unwrap()
});

// A duration no other test uses for each backend: pgrep looks at the whole machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_timeout_kills_the_group_local() {
    let dir = tempfile::tempdir().unwrap();
    let ws = conformance::lay_out(dir.path());
    conformance::bash_timeout_kills_the_group(&local(&ws, SandboxOptions::default()), "30.517")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_timeout_kills_the_group_bwrap() {
    let dir = tempfile::tempdir().unwrap();
    let ws = conformance::lay_out(dir.path());
    conformance::bash_timeout_kills_the_group(&bwrap(&ws, bwrap_options()), "30.519").await;
}

fn capped(options: SandboxOptions) -> SandboxOptions {
    SandboxOptions {
        max_output_bytes: CAPPED_OUTPUT,
        ..options
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_capped_local() {
    let dir = tempfile::tempdir().unwrap();
    let ws = conformance::lay_out(dir.path());
    conformance::output_is_capped(&local(&ws, capped(SandboxOptions::default()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_capped_bwrap() {
    let dir = tempfile::tempdir().unwrap();
    let ws = conformance::lay_out(dir.path());
    conformance::output_is_capped(&bwrap(&ws, capped(bwrap_options()))).await;
}
