//! The OpenAPI document a real server serves, and the answers `scripts/api-fuzz` found at odds
//! with it: each test here pins one, so that it stays fixed without the fuzzer.

mod common;

use common::*;
use hyper::Method;

async fn document(server: &Server) -> serde_json::Value {
    let answer = call(&server.anonymous(), Method::GET, "/openapi.json", "").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_plane_needs_a_token_in_the_document_exactly_when_the_server_has_one() {
    let open = Server::start();
    let open_document = document(&open).await;
    let acquire = &open_document["paths"]["/v1/acquire"]["post"];
    assert!(acquire.get("security").is_none(), "{acquire}");
    assert!(acquire["responses"].get("401").is_none(), "{acquire}");
    // The admin API always needs its token.
    let list = &open_document["paths"]["/v1/limits"]["get"];
    assert_eq!(list["security"], serde_json::json!([{"admin": []}]));

    let closed = Server::start_with(Options {
        env: vec![
            ("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN),
            ("TOLLGATE_DATA_TOKEN", "data-token"),
        ],
        ..Options::default()
    });
    let closed_document = document(&closed).await;
    for (path, method) in [
        ("/v1/acquire", "post"),
        ("/v1/permits/{permit}/commit", "post"),
        ("/v1/permits/{permit}/renew", "post"),
        ("/v1/pause", "post"),
        ("/v1/check", "post"),
        ("/v1/stats", "get"),
    ] {
        let operation = &closed_document["paths"][path][method];
        assert_eq!(
            operation["security"],
            serde_json::json!([{"data": []}]),
            "{path}"
        );
        assert_eq!(
            operation["responses"]["401"]["$ref"], "#/components/responses/Unauthorized",
            "{path}"
        );
    }
    // What the document says of a 401 is what the server sends.
    let answer = post(&closed.anonymous(), "/v1/acquire", "{}").await;
    assert_error(&answer, 401, "unauthorized", None);
    assert_eq!(answer.headers["www-authenticate"], "Bearer");
    let unauthorized = &closed_document["components"]["responses"]["Unauthorized"];
    assert_eq!(
        unauthorized["headers"]["WWW-Authenticate"]["required"],
        true
    );
}

/// utoipa 5.5 writes a link's fields in snake case, which no OpenAPI tool reads: the stateful
/// fuzzing found no link to follow until the server spelled them as OpenAPI does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_are_spelled_as_openapi_spells_them() {
    let server = Server::start();
    let document = document(&server).await;
    let links = &document["paths"]["/v1/acquire"]["post"]["responses"]["200"]["links"];
    assert_eq!(
        links["Commit"],
        serde_json::json!({"operationId": "commit",
            "parameters": {"permit": "$response.body#/permit"}}),
        "{links}"
    );
    let put = &document["paths"]["/v1/limits/{name}"]["put"]["responses"]["200"]["links"];
    assert_eq!(
        put["Acquire"]["requestBody"],
        serde_json::json!({"limits": ["$request.path.name"]})
    );
    assert!(!document.to_string().contains("operation_id"));
}

/// Every endpoint the server routes is in the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_is_documented() {
    let server = Server::start();
    let document = document(&server).await;
    for (path, methods) in [
        ("/v1/limits", &["get"][..]),
        ("/v1/limits/{name}", &["get", "put", "delete"]),
        ("/v1/acquire", &["post"]),
        ("/v1/permits/{permit}/commit", &["post"]),
        ("/v1/permits/{permit}/renew", &["post"]),
        ("/v1/pause", &["post"]),
        ("/v1/check", &["post"]),
        ("/v1/stats", &["get"]),
        ("/v1/tokens", &["get", "post"]),
        ("/v1/tokens/{name}", &["delete"]),
        ("/v1/admin-token/proof", &["get"]),
        ("/healthz", &["get"]),
        ("/readyz", &["get"]),
        ("/metrics", &["get"]),
        ("/openapi.json", &["get"]),
        ("/ui", &["get"]),
        ("/ui/{asset}", &["get"]),
    ] {
        for method in methods {
            assert!(
                document["paths"][path].get(*method).is_some(),
                "{method} {path} is not documented"
            );
        }
    }
}

/// A query parameter given twice was refused naming `query`, which is no parameter; it names
/// the parameter now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_query_parameter_is_named() {
    let server = Server::start();
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":2,"period_ms":1000}"#,
    )
    .await;
    let client = server.anonymous();
    for (query, field) in [
        ("limit=vendor-x&limit=vendor-x", "limit"),
        ("limit=vendor-x&key=a&key=b", "key"),
        ("colour=red", "colour"),
        // A parameter with no name cannot be named: the query string is.
        ("=false", "query"),
    ] {
        let answer = call(&client, Method::GET, &format!("/v1/stats?{query}"), "").await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
}

/// A body field given twice was refused naming the object holding it (`body`, `reserve`); it
/// names the field now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_body_field_is_named() {
    let server = Server::start();
    let client = server.anonymous();
    assert_error(
        &post(&client, "/v1/acquire", r#"{"limits":["a"],"limits":["b"]}"#).await,
        400,
        "bad_request",
        Some("limits"),
    );
    let answer = call(
        &server.admin(),
        Method::PUT,
        "/v1/limits/vendor-x",
        r#"{"kind":"rate","limit":2,"period_ms":1000,"reserve":{"high":0,"high":1}}"#,
    )
    .await;
    assert_error(&answer, 400, "bad_request", Some("reserve.high"));
}

/// A body with a field named by the empty string was refused naming the field `""`, which
/// names nothing; the object holding it is named now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_with_an_empty_name_names_its_object() {
    let server = Server::start();
    let client = server.anonymous();
    for (path, body, field) in [
        ("/v1/acquire", r#"{"limits":["a"],"":1}"#, "body"),
        ("/v1/check", r#"{"":null}"#, "body"),
        ("/v1/pause", r#"{"":null}"#, "body"),
        ("/v1/permits/00/commit", r#"{"":[]}"#, "body"),
    ] {
        assert_error(
            &post(&client, path, body).await,
            400,
            "bad_request",
            Some(field),
        );
    }
    let answer = call(
        &server.admin(),
        Method::PUT,
        "/v1/limits/vendor-x",
        r#"{"kind":"rate","limit":2,"period_ms":1000,"reserve":{"":1}}"#,
    )
    .await;
    assert_error(&answer, 400, "bad_request", Some("reserve"));
}

/// `reserve` and `match` given as arrays were read by position (`"reserve": [null, null]` was
/// stored as no reserve); they are refused, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_object_given_as_an_array_is_refused() {
    let server = Server::start();
    for (body, field) in [
        (
            r#"{"kind":"concurrency","limit":5,"lease_ttl_ms":30000,"reserve":[null,null]}"#,
            "reserve",
        ),
        (
            r#"{"kind":"rate","limit":5,"period_ms":1000,"match":["GET","/a"]}"#,
            "match",
        ),
    ] {
        let answer = call(&server.admin(), Method::PUT, "/v1/limits/vendor-x", body).await;
        assert_error(&answer, 400, "bad_request", Some(field));
    }
}

/// An empty `user` was allowed by `/v1/check` when no rule matched and refused when one did; it
/// is refused either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_an_invalid_user_whether_or_not_a_rule_matches() {
    let server = Server::start();
    let client = server.anonymous();
    let unmatched = r#"{"user":"","method":"GET","path":"/nothing/here"}"#;
    assert_error(
        &post(&client, "/v1/check", unmatched).await,
        400,
        "bad_request",
        Some("user"),
    );
    let answer = post(
        &client,
        "/v1/check",
        r#"{"user":"u1","method":"GET","path":"/a"}"#,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// A scoped token beyond its scope is a 403 on the data plane's decisions and views, as the
/// document says, with the challenge it documents; commit and renew take any valid token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_for_a_scoped_token_is_documented_as_sent() {
    let server = Server::start();
    let document = document(&server).await;
    for (path, method) in [
        ("/v1/acquire", "post"),
        ("/v1/pause", "post"),
        ("/v1/check", "post"),
        ("/v1/stats", "get"),
    ] {
        assert_eq!(
            document["paths"][path][method]["responses"]["403"]["$ref"],
            "#/components/responses/Forbidden",
            "{path}"
        );
    }
    // Commit and renew take any valid data token: their 403 is only the guard's (a foreign
    // Host or Origin), the same response.
    for path in ["/v1/permits/{permit}/commit", "/v1/permits/{permit}/renew"] {
        assert_eq!(
            document["paths"][path]["post"]["responses"]["403"]["$ref"],
            "#/components/responses/Forbidden",
            "{path}"
        );
    }
    let created = post(
        &server.admin(),
        "/v1/tokens",
        r#"{"name":"low","limits":["*"],"priority_max":"low"}"#,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text());
    let created = created.json.expect("json");
    let new_token = &document["components"]["schemas"]["NewToken"];
    let mut documented: Vec<&str> = new_token["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .map(String::as_str)
        .collect();
    let mut sent: Vec<&str> = created
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    documented.sort_unstable();
    sent.sort_unstable();
    assert_eq!(documented, sent);
    put_limit(
        &server,
        "vendor-x",
        r#"{"kind":"rate","limit":2,"period_ms":1000}"#,
    )
    .await;
    let secret = created["secret"].as_str().expect("secret");
    let answer = post(
        &server.with_token(secret),
        "/v1/acquire",
        r#"{"limits":["vendor-x"],"priority":"high"}"#,
    )
    .await;
    assert_error(&answer, 403, "forbidden", None);
    let forbidden = &document["components"]["responses"]["Forbidden"];
    assert_eq!(
        forbidden["headers"]["WWW-Authenticate"]["required"], true,
        "{forbidden}"
    );
    assert_eq!(
        forbidden["headers"]["WWW-Authenticate"]["schema"]["enum"][0],
        answer.headers["www-authenticate"].to_str().expect("text")
    );
}
