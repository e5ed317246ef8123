//! Tokens issued, scoped, listed and revoked through the API by an operator's `admin`
//! token, and the audit log of who did what: a `read` token cannot change anything, a
//! `run` token acts as its owner, a revoked or expired token stops at once, the token
//! itself is shown once and never again, and nobody without `admin` reaches any of it.

mod common;

use std::time::Duration;

use common::{assert_error, call, server};
use serde_json::{json, Value};
use steadfast_server::Auth;
use steadfast_world::Scope;

fn statics() -> Auth {
    common::auth_of(&[
        ("alice", "alice-secret", None),
        ("ops", "root-secret", Some(vec![Scope::Admin])),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_issued_scoped_revoked_and_audited() {
    let srv = server(json!([]), statics(), 0, |_| {}).await;
    let url = |path: &str| format!("{}{path}", srv.url);
    let root = Some("root-secret");
    let issue = |body: Value, token: Option<&'static str>| {
        let at = url("/v1/admin/tokens");
        async move { call(reqwest::Method::POST, &at, token, Some(body)).await }
    };

    // Only `admin` issues; the operator's admin token has no session rights.
    let got = issue(
        json!({"name": "x", "owner": "x", "scopes": ["read"]}),
        Some("alice-secret"),
    )
    .await;
    assert_error(&got, 403, "forbidden");
    assert!(got.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`admin`"));
    assert_error(
        &call(reqwest::Method::GET, &url("/v1/sessions"), root, None).await,
        403,
        "forbidden",
    );

    let (status, reader) = issue(
        json!({"name": "dashboards", "owner": "ci-bot", "scopes": ["read"]}),
        root,
    )
    .await;
    assert_eq!(status, 201, "{reader}");
    let read_token = reader["token"].as_str().unwrap().to_string();
    assert!(
        read_token.starts_with("sft_") && read_token.len() > 60,
        "{read_token}"
    );
    assert_eq!(reader["issued"]["scopes"], json!(["read"]));
    let (status, runner) = issue(
        json!({"name": "ci pipeline", "owner": "ci-bot", "scopes": ["run", "run"]}),
        root,
    )
    .await;
    assert_eq!(status, 201, "{runner}");
    let run_token = runner["token"].as_str().unwrap().to_string();
    let run_id = runner["issued"]["id"].as_str().unwrap().to_string();
    assert_eq!(runner["issued"]["scopes"], json!(["run"]), "once each");

    // `read` reads, `run` acts (and reads) as the token's owner.
    let sessions = url("/v1/sessions");
    assert_eq!(
        call(reqwest::Method::GET, &sessions, Some(&read_token), None)
            .await
            .0,
        200
    );
    let got = call(
        reqwest::Method::POST,
        &sessions,
        Some(&read_token),
        Some(json!({})),
    )
    .await;
    assert_error(&got, 403, "forbidden");
    assert!(got.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`run`"));
    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        Some(&run_token),
        Some(json!({"labels": {"via": "ci"}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let (_, listed) = call(reqwest::Method::GET, &sessions, Some(&read_token), None).await;
    assert_eq!(listed["sessions"][0]["id"], id.as_str());
    assert_eq!(listed["sessions"][0]["owner"], "ci-bot");
    let (_, alices) = call(reqwest::Method::GET, &sessions, Some("alice-secret"), None).await;
    assert_eq!(alices["sessions"], json!([]));
    let (status, _) = call(
        reqwest::Method::PATCH,
        &format!("{sessions}/{id}"),
        Some(&run_token),
        Some(json!({"title": "CI run 12"})),
    )
    .await;
    assert_eq!(status, 200);

    // Listed by name, never the token.
    let (status, list) = call(reqwest::Method::GET, &url("/v1/admin/tokens"), root, None).await;
    assert_eq!(status, 200);
    let text = list.to_string();
    assert!(
        !text.contains(&read_token) && !text.contains(&run_token),
        "{text}"
    );
    let names: Vec<&str> = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ci pipeline", "dashboards"]);
    assert_eq!(list["tokens"][0]["created_by"], "ops");

    // Revoked: refused at once; a second revocation finds nothing.
    let revoke = url(&format!("/v1/admin/tokens/{run_id}"));
    assert_eq!(
        call(reqwest::Method::DELETE, &revoke, root, None).await.0,
        204
    );
    let got = call(reqwest::Method::GET, &sessions, Some(&run_token), None).await;
    assert_error(&got, 401, "unauthorized");
    assert_error(
        &call(reqwest::Method::DELETE, &revoke, root, None).await,
        404,
        "token_not_found",
    );
    let (_, list) = call(reqwest::Method::GET, &url("/v1/admin/tokens"), root, None).await;
    assert!(
        list["tokens"][0]["revoked_at_ms"].as_u64().is_some(),
        "{list}"
    );

    // Expired: refused once its time is up.
    let (_, brief) = issue(
        json!({"name": "brief", "owner": "ci-bot", "scopes": ["read"], "expires_in_s": 1}),
        root,
    )
    .await;
    let brief = brief["token"].as_str().unwrap().to_string();
    assert_eq!(
        call(reqwest::Method::GET, &sessions, Some(&brief), None)
            .await
            .0,
        200
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_error(
        &call(reqwest::Method::GET, &sessions, Some(&brief), None).await,
        401,
        "unauthorized",
    );
    assert_error(
        &call(
            reqwest::Method::GET,
            &sessions,
            Some("sft_0000000000000000000000000000000000000000"),
            None,
        )
        .await,
        401,
        "unauthorized",
    );

    // Bad requests name the field.
    for (body, field) in [
        (
            json!({"name": "", "owner": "x", "scopes": ["read"]}),
            "name",
        ),
        (
            json!({"name": "x", "owner": "", "scopes": ["read"]}),
            "owner",
        ),
        (json!({"name": "x", "owner": "x", "scopes": []}), "scopes"),
        (
            json!({"name": "x", "owner": "x", "scopes": ["root"]}),
            "root",
        ),
        (
            json!({"name": "x", "owner": "x", "scopes": ["read"], "expires_in_s": 0}),
            "expires_in_s",
        ),
    ] {
        let got = issue(body, root).await;
        assert_error(&got, 422, "invalid_body");
        assert!(
            got.1["error"]["message"].as_str().unwrap().contains(field),
            "{field}: {got:?}"
        );
    }

    // The audit log: who did what, in order, a page at a time; admins only.
    assert_error(
        &call(
            reqwest::Method::GET,
            &url("/v1/audit"),
            Some("alice-secret"),
            None,
        )
        .await,
        403,
        "forbidden",
    );
    let mut entries = Vec::new();
    let mut after = 0;
    loop {
        let (status, page) = call(
            reqwest::Method::GET,
            &url(&format!("/v1/audit?after={after}&limit=2")),
            root,
            None,
        )
        .await;
        assert_eq!(status, 200, "{page}");
        let got = page["entries"].as_array().unwrap().clone();
        if got.is_empty() {
            break;
        }
        after = page["next_after"].as_u64().unwrap();
        entries.extend(got);
    }
    let seen: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().into(),
                e["action"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [
        ("ops", "token.issued"),
        ("ops", "token.issued"),
        ("ci-bot", "session.created"),
        ("ci-bot", "session.changed"),
        ("ops", "token.revoked"),
        ("ops", "token.issued"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(seen, want);
    assert_eq!(entries[2]["target"], id.as_str());
    assert_eq!(entries[2]["detail"]["labels"]["via"], "ci");
    assert_eq!(entries[4]["target"], run_id.as_str());
    assert!(
        !entries.iter().any(|e| e.to_string().contains("sft_")),
        "no token in the log"
    );
}
