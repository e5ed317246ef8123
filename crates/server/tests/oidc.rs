//! OpenID Connect bearer tokens against a local identity provider on loopback (a
//! discovery document and a JWKS, with an RSA key made by `openssl` and an EC key made
//! by ring): a valid token acts as its `sub`, beside the static tokens; expired, foreign,
//! forged and algorithm-confused tokens are refused with a 401 saying why; a key the
//! provider publishes later is fetched when a token first names it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use common::{assert_error, call, server};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use steadfast_server::oidc::{AdminClaim, Oidc, OidcConfig};
use steadfast_server::{hash_token, Auth, TokenEntry};

const AUDIENCE: &str = "steadfast-api";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// An RSA key made by openssl: its private PEM and its public JWK under `kid`.
fn rsa_key(dir: &std::path::Path, kid: &str) -> (EncodingKey, Value) {
    let pem = dir.join(format!("{kid}.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&pem)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let modulus = std::process::Command::new("openssl")
        .args(["rsa", "-noout", "-modulus", "-in"])
        .arg(&pem)
        .output()
        .unwrap();
    let hex_n = String::from_utf8(modulus.stdout).unwrap();
    let n = hex::decode(hex_n.trim().trim_start_matches("Modulus=")).unwrap();
    let key = EncodingKey::from_rsa_pem(&std::fs::read(&pem).unwrap()).unwrap();
    (
        key,
        json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": b64(&n), "e": "AQAB"}),
    )
}

/// A P-256 key made by ring: its signing key and its public JWK under `kid`.
fn ec_key(kid: &str) -> (EncodingKey, Value) {
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref().to_vec();
    (
        EncodingKey::from_ec_der(pkcs8.as_ref()),
        json!({"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65])}),
    )
}

/// The identity provider: a discovery document and the keys it publishes now.
async fn provider(keys: Arc<Mutex<Vec<Value>>>) -> String {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let discovery = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/keys")});
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            get(move || async move { axum::Json(discovery) }),
        )
        .route(
            "/keys",
            get(move || async move { axum::Json(json!({"keys": keys.lock().unwrap().clone()})) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    issuer
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token(key: &EncodingKey, alg: Algorithm, kid: &str, claims: Value) -> String {
    let mut header = Header::new(alg);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_the_identity_provider_act_as_their_subject() {
    let dir = tempfile::tempdir().unwrap();
    let (rsa, rsa_jwk) = rsa_key(dir.path(), "k1");
    let (ec, ec_jwk) = ec_key("k2");
    let published = Arc::new(Mutex::new(vec![rsa_jwk.clone()]));
    let issuer = provider(published.clone()).await;
    let mut config = OidcConfig::new(&issuer, AUDIENCE);
    config.min_refresh = Duration::ZERO;
    config.admins = Some(AdminClaim {
        claim: "groups".into(),
        values: vec!["steadfast-admins".into()],
    });
    let oidc = Oidc::start(config).await.unwrap();
    let statics = [TokenEntry {
        owner: "bob".into(),
        token_hash: hash_token("bob-secret"),
        scopes: None,
    }];
    let auth = Auth::with_oidc(&statics, Some(oidc), true, None).unwrap();
    let srv = server(json!([]), auth, 0, |_| {}).await;
    let sessions = format!("{}/v1/sessions", srv.url);
    let claims = |sub: &str| json!({"iss": issuer, "aud": AUDIENCE, "sub": sub, "iat": now(), "exp": now() + 300});

    // Carol, known to the provider only, makes a session and sees it; Bob (a static
    // token) does not.
    let carol = token(&rsa, Algorithm::RS256, "k1", claims("carol"));
    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        Some(&carol),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let (_, listed) = call(reqwest::Method::GET, &sessions, Some(&carol), None).await;
    assert_eq!(listed["sessions"][0]["id"], id);
    assert_eq!(listed["sessions"][0]["owner"], "carol");
    let (_, bobs) = call(reqwest::Method::GET, &sessions, Some("bob-secret"), None).await;
    assert_eq!(
        bobs["sessions"],
        json!([]),
        "static tokens still work, as their owner"
    );
    assert_error(
        &call(
            reqwest::Method::GET,
            &format!("{sessions}/{id}"),
            Some("bob-secret"),
            None,
        )
        .await,
        404,
        "session_not_found",
    );

    // An operator is one whose `groups` holds the configured value: the audit log
    // (admin scope) is theirs alone.
    let audit = format!("{}/v1/audit", srv.url);
    let mut operator = claims("olga");
    operator["groups"] = json!(["developers", "steadfast-admins"]);
    let olga = token(&rsa, Algorithm::RS256, "k1", operator);
    let (status, body) = call(reqwest::Method::GET, &audit, Some(&olga), None).await;
    assert_eq!(status, 200, "{body}");
    let mut single = claims("oscar");
    single["groups"] = json!("steadfast-admins");
    let oscar = token(&rsa, Algorithm::RS256, "k1", single);
    assert_eq!(
        call(reqwest::Method::GET, &audit, Some(&oscar), None)
            .await
            .0,
        200
    );
    let mut developer = claims("dan");
    developer["groups"] = json!(["developers", "steadfast-admins-not"]);
    let dan = token(&rsa, Algorithm::RS256, "k1", developer);
    let refused_audit = call(reqwest::Method::GET, &audit, Some(&dan), None).await;
    assert_eq!(refused_audit.0, 403, "{}", refused_audit.1);
    assert_eq!(
        call(reqwest::Method::GET, &audit, Some(&carol), None)
            .await
            .0,
        403,
        "a token with no groups is no operator"
    );

    // Refused, each saying why.
    let refused = |token: String, why: &'static str| {
        let sessions = sessions.clone();
        async move {
            let got = call(reqwest::Method::GET, &sessions, Some(&token), None).await;
            assert_error(&got, 401, "unauthorized");
            let message = got.1["error"]["message"].as_str().unwrap().to_string();
            assert!(message.contains(why), "{why}: {message}");
        }
    };
    let mut expired = claims("carol");
    expired["exp"] = json!(now() - 120);
    refused(
        token(&rsa, Algorithm::RS256, "k1", expired),
        "ExpiredSignature",
    )
    .await;
    let mut elsewhere = claims("carol");
    elsewhere["aud"] = json!("another-api");
    refused(
        token(&rsa, Algorithm::RS256, "k1", elsewhere),
        "InvalidAudience",
    )
    .await;
    let mut foreign = claims("carol");
    foreign["iss"] = json!("https://evil.example.com");
    refused(
        token(&rsa, Algorithm::RS256, "k1", foreign),
        "InvalidIssuer",
    )
    .await;
    let mut early = claims("carol");
    early["nbf"] = json!(now() + 600);
    refused(
        token(&rsa, Algorithm::RS256, "k1", early),
        "ImmatureSignature",
    )
    .await;
    let mut nobody = claims("carol");
    nobody.as_object_mut().unwrap().remove("sub");
    refused(token(&rsa, Algorithm::RS256, "k1", nobody), "`sub` claim").await;
    // Signed by another key under a published key's id.
    let (forger, _) = rsa_key(dir.path(), "forger");
    refused(
        token(&forger, Algorithm::RS256, "k1", claims("carol")),
        "InvalidSignature",
    )
    .await;
    // The public key used as a shared secret, and no signature at all.
    let public = EncodingKey::from_secret(rsa_jwk["n"].as_str().unwrap().as_bytes());
    refused(
        token(&public, Algorithm::HS256, "k1", claims("carol")),
        "InvalidAlgorithm",
    )
    .await;
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "kid": "k1"}).to_string().as_bytes()),
        b64(claims("carol").to_string().as_bytes())
    );
    refused(unsigned, "not a JWT this server can read").await;
    refused("not-a-token".into(), "unknown token").await;

    // A key the provider has not published yet, then publishes: fetched when a token
    // first names it, with no restart.
    let dave = token(&ec, Algorithm::ES256, "k2", claims("dave"));
    refused(dave.clone(), "`k2` is not among the issuer's keys").await;
    published.lock().unwrap().push(ec_jwk);
    let (status, listed) = call(reqwest::Method::GET, &sessions, Some(&dave), None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["sessions"], json!([]), "Dave sees none of Carol's");
}

#[tokio::test]
async fn a_server_whose_issuer_cannot_be_reached_does_not_start() {
    let e = Oidc::start(OidcConfig::new("http://127.0.0.1:1", AUDIENCE))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("OpenID issuer http://127.0.0.1:1"),
        "{e}"
    );
    // A provider whose discovery names another issuer is refused too.
    let keys = Arc::new(Mutex::new(vec![]));
    let issuer = provider(keys).await;
    let e = Oidc::start(OidcConfig::new(&format!("{issuer}/"), AUDIENCE))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("names the issuer"), "{e}");
}
