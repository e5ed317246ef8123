//! The checked-in `openapi.json` is the document the server generates from its types:
//! a change to a route or a reply type that is not carried into the copy fails here.
//! `STEADFAST_UPDATE_OPENAPI=1 cargo test -p steadfast-server --test openapi` rewrites
//! the copy.

use std::path::Path;

#[test]
fn the_checked_in_document_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    let generated = steadfast_server::openapi::document();
    if std::env::var_os("STEADFAST_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is stale: run `STEADFAST_UPDATE_OPENAPI=1 cargo test -p steadfast-server --test openapi` and commit it",
        path.display()
    );
}

#[test]
fn every_operation_has_its_own_id_and_answers_errors_as_the_error_schema() {
    let doc: serde_json::Value =
        serde_json::from_str(steadfast_server::openapi::document()).unwrap();
    let mut operations = 0;
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            let id = op["operationId"].as_str().unwrap_or_default().to_string();
            assert!(
                ids.insert(id.clone()),
                "{method} {path}: operationId `{id}` twice"
            );
            assert!(op["summary"].is_string(), "{method} {path} has no summary");
            for (status, response) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(
                        response["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/Error",
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }
    assert_eq!(operations, 47);
}

#[test]
fn every_example_in_the_document_is_valid_by_its_own_schema() {
    let doc: serde_json::Value =
        serde_json::from_str(steadfast_server::openapi::document()).unwrap();
    let components = &doc["components"];
    let mut checked = 0;
    for (name, schema) in components["schemas"].as_object().unwrap() {
        let Some(example) = schema.get("example") else {
            continue;
        };
        let root = serde_json::json!({
            "components": components,
            "$ref": format!("#/components/schemas/{name}"),
        });
        let validator = jsonschema::draft202012::new(&root).unwrap();
        let problems: Vec<String> = validator
            .iter_errors(example)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(problems.is_empty(), "{name}'s example: {problems:?}");
        checked += 1;
    }
    assert!(checked >= 10, "{checked} examples");
}
