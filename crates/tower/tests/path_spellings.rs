//! One request, one meaning (G9, docs/guarantees.md): the example service's routes, and any
//! spelling of a request path that the router sends to the same handler with the same id as the
//! plain spelling gets the same rules applied by the layer.
//!
//! Spellings vary what a router may read alike: ids with leading zeros or a `+`, characters
//! percent-encoded in upper or lower case, extra `./` and `x/../` segments, doubled slashes.

use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::routing::get;
use http::Request;
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::Limiter;
use tollgate_rules::{RawRule, Rule, Validate};
use tollgate_tower::{
    Identity, OnStoreError, ThrottleConfig, ThrottleLayer, ThrottleRules, Unidentified,
};
use tower::ServiceExt;

/// The authenticated user, as the example's authentication layer stores it.
#[derive(Clone, Debug)]
struct User(String);

/// The example's three rules, with limits no test here reaches: only matching is at stake.
fn example_rules() -> Vec<Rule> {
    [
        (
            "user-concurrency",
            r#"{"kind":"concurrency","limit":1000,"lease_ttl_ms":60000,"per":"user",
                "match":{"method":"*","path":"*"}}"#,
        ),
        (
            "user-frequency",
            r#"{"kind":"rate","limit":1000000,"period_ms":60000,"algorithm":"fixed",
                "per":"user","match":{"method":"*","path":"*"}}"#,
        ),
        (
            "entity-bundle",
            r#"{"kind":"rate","limit":1000000,"period_ms":60000,"algorithm":"fixed",
                "per":"user","match":{"method":"GET","path":"/repo/v1/entity/#/bundle"}}"#,
        ),
    ]
    .into_iter()
    .map(|(name, json)| {
        let raw: RawRule = serde_json::from_str(json).expect("rule parses");
        raw.validate(name).expect("rule is valid")
    })
    .collect()
}

/// The example's routes and handlers, behind the layer.
fn app(layer: ThrottleLayer) -> Router {
    Router::new()
        .route(
            "/repo/v1/entity/{id}/bundle",
            get(|Path(id): Path<u64>| async move { format!("bundle of {id}") }),
        )
        .route(
            "/repo/v1/entity/{id}",
            get(|Path(id): Path<u64>| async move { format!("entity {id}") }),
        )
        .layer(layer)
}

/// What the router answered and which rules the layer applied.
#[derive(Debug, PartialEq, Eq)]
struct Served {
    status: u16,
    body: String,
    policy: Option<String>,
}

async fn get_path(app: &Router, path: &str) -> Result<Served, TestCaseError> {
    let request = Request::get(path)
        .extension(User("alice".to_owned()))
        .body(Body::empty())
        .map_err(|error| TestCaseError::fail(format!("{path:?} is no URI: {error}")))?;
    let response = app
        .clone()
        .oneshot(request)
        .await
        .map_err(|error| TestCaseError::fail(format!("{error}")))?;
    let status = response.status().as_u16();
    let policy = response
        .headers()
        .get("ratelimit-policy")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| TestCaseError::fail(format!("{error}")))?
        .to_bytes();
    Ok(Served {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        policy,
    })
}

/// How one character is written.
#[derive(Clone, Copy, Debug)]
enum Spelled {
    Plain,
    Upper,
    Lower,
}

fn spelled() -> impl Strategy<Value = Spelled> {
    prop_oneof![
        3 => Just(Spelled::Plain),
        1 => Just(Spelled::Upper),
        1 => Just(Spelled::Lower),
    ]
}

/// What comes before a segment besides its slash.
#[derive(Clone, Copy, Debug)]
enum Before {
    Dot,
    DotDot,
    Slash,
}

fn before() -> impl Strategy<Value = Before> {
    prop_oneof![Just(Before::Dot), Just(Before::DotDot), Just(Before::Slash)]
}

/// A request path and one of its spellings. The router matches the literal segments as
/// written, so most spellings vary the id alone, and a few one more thing (which the router
/// then answers 404, or serves as the plain spelling).
#[derive(Clone, Debug)]
struct Case {
    bundle: bool,
    id: u64,
    zeros: usize,
    plus: bool,
    /// Cycled over the id's characters.
    id_characters: Vec<Spelled>,
    /// One character outside the id spelled otherwise: its index, cycled over them.
    literal: Option<(usize, Spelled)>,
    /// Something before one segment: its index, cycled over them.
    before: Option<(usize, Before)>,
}

fn case() -> impl Strategy<Value = Case> {
    let literal = prop_oneof![
        3 => Just(None),
        1 => (any::<usize>(), prop_oneof![Just(Spelled::Upper), Just(Spelled::Lower)])
            .prop_map(Some),
    ];
    let before = prop_oneof![
        2 => Just(None),
        1 => (any::<usize>(), before()).prop_map(Some),
    ];
    (
        any::<bool>(),
        prop_oneof![0..1000u64, any::<u64>()],
        0..3usize,
        any::<bool>(),
        proptest::collection::vec(spelled(), 1..8),
        literal,
        before,
    )
        .prop_map(
            |(bundle, id, zeros, plus, id_characters, literal, before)| Case {
                bundle,
                id,
                zeros,
                plus,
                id_characters,
                literal,
                before,
            },
        )
}

fn spell(c: char, spelled: Spelled, path: &mut String) {
    match spelled {
        Spelled::Plain => path.push(c),
        Spelled::Upper => path.push_str(&format!("%{:02X}", u32::from(c))),
        Spelled::Lower => path.push_str(&format!("%{:02x}", u32::from(c))),
    }
}

impl Case {
    fn canonical(&self) -> String {
        let tail = if self.bundle { "/bundle" } else { "" };
        format!("/repo/v1/entity/{}{tail}", self.id)
    }

    fn spelling(&self) -> String {
        let id = format!(
            "{}{}{}",
            if self.plus { "+" } else { "" },
            "0".repeat(self.zeros),
            self.id
        );
        let mut segments = vec!["repo", "v1", "entity", id.as_str()];
        if self.bundle {
            segments.push("bundle");
        }
        let literal_chars: usize = segments
            .iter()
            .enumerate()
            .filter(|&(index, _)| index != 3)
            .map(|(_, segment)| segment.len())
            .sum();
        let literal = self
            .literal
            .map(|(index, spelled)| (index % literal_chars, spelled));
        let before = self
            .before
            .map(|(index, before)| (index % segments.len(), before));
        let mut path = String::new();
        let mut id_characters = self.id_characters.iter().cycle();
        let mut literal_index = 0;
        for (index, segment) in segments.iter().enumerate() {
            path.push('/');
            match before {
                Some((at, Before::Dot)) if at == index => path.push_str("./"),
                Some((at, Before::DotDot)) if at == index => path.push_str("x/../"),
                Some((at, Before::Slash)) if at == index => path.push('/'),
                _ => {}
            }
            for c in segment.chars() {
                let spelled = if index == 3 {
                    id_characters.next().copied().unwrap_or(Spelled::Plain)
                } else {
                    literal_index += 1;
                    match literal {
                        Some((at, spelled)) if at + 1 == literal_index => spelled,
                        _ => Spelled::Plain,
                    }
                };
                spell(c, spelled, &mut path);
            }
        }
        path
    }
}

#[test]
fn spellings_the_router_reads_alike_match_the_same_rules() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let layer = ThrottleLayer::new(
        Limiter::in_memory(),
        ThrottleRules::fixed(example_rules()).expect("no request matches too many rules"),
        ThrottleConfig {
            identity: Identity::principal(|extensions| {
                extensions.get::<User>().map(|user| user.0.as_str())
            }),
            unidentified: Unidentified::Reject,
            headers_on_allowed: true,
            on_store_error: OnStoreError::FailClosed,
        },
    );
    let app = app(layer);
    // Spellings other than the plain one that the router served as the plain one.
    let routed_alike = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        // Nothing to persist failures to outside the `proptest!` macro.
        failure_persistence: None,
        ..Config::with_cases(512)
    });
    runner
        .run(&case(), |case| {
            runtime.block_on(async {
                let canonical = get_path(&app, &case.canonical()).await?;
                prop_assert_eq!(canonical.status, 200, "{:?}", canonical);
                prop_assert!(canonical.policy.is_some(), "{:?}", canonical);
                let spelling = case.spelling();
                let served = get_path(&app, &spelling).await?;
                if served.status == 200 && served.body == canonical.body {
                    if spelling != case.canonical() {
                        routed_alike.fetch_add(1, Ordering::Relaxed);
                    }
                    prop_assert_eq!(
                        &served.policy,
                        &canonical.policy,
                        "{} was served as {}",
                        spelling,
                        case.canonical()
                    );
                }
                Ok(())
            })
        })
        .expect("every spelling served alike matches alike");
    let routed_alike = routed_alike.load(Ordering::Relaxed);
    assert!(
        routed_alike > 50,
        "{routed_alike} spellings reached a handler as the plain one: too few to say much"
    );
}
