//! The dashboard at `/ui`: serves its page and the files the page loads (`/ui/app.js`,
//! `/ui/style.css`, `/ui/favicon.svg`) from the binary, with the headers that keep it safe to
//! open: a strict Content-Security-Policy (scripts, styles and connections from this origin
//! only, no inline script), `X-Content-Type-Options: nosniff`, no framing.
//!
//! The page itself (`ui/index.html`, `ui/app.js`, `ui/style.css`) is plain HTML, JavaScript
//! and CSS with no build step. It reads only the documented endpoints: `GET /v1/stats` for the
//! limits, their usage and the rules and store state, `GET /readyz` for health, and, with the
//! admin token an operator types in, `GET`/`PUT /v1/limits`, `POST /v1/pause`, and
//! `GET /v1/tokens` and `DELETE /v1/tokens/{name}` for the scoped data tokens (listed without
//! their secrets, which the server does not keep). This module owns no API of its own.

use axum::extract::Path;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const STYLE_CSS: &str = include_str!("ui/style.css");
const FAVICON_SVG: &str = include_str!("ui/favicon.svg");

/// Everything from this origin, nothing inline, nothing framing the page. `img-src` allows
/// nothing but this origin either: the charts are SVG elements built by the script.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /ui`: the page.
#[utoipa::path(get, path = "/ui", tag = "operations",
    responses((status = 200, description = "the dashboard's page", content_type = "text/html",
        body = String)))]
pub(crate) async fn index() -> Response {
    file(INDEX_HTML, "text/html; charset=utf-8")
}

/// `GET /ui/{asset}`: a file the page loads.
#[utoipa::path(get, path = "/ui/{asset}", tag = "operations",
    params(("asset" = tollgate_api::schema::UiAsset, Path,
        description = "a file of the dashboard; any other name is a 404")),
    responses(
        (status = 200, description = "the file", content(
            (String = "text/javascript"), (String = "text/css"), (String = "image/svg+xml"))),
        (status = 404, description = "no such file", body = tollgate_api::schema::NotFoundError)))]
pub(crate) async fn asset(Path(asset): Path<String>) -> Response {
    match asset.as_str() {
        "app.js" => file(APP_JS, "text/javascript; charset=utf-8"),
        "style.css" => file(STYLE_CSS, "text/css; charset=utf-8"),
        "favicon.svg" => file(FAVICON_SVG, "image/svg+xml"),
        _ => {
            ApiError::not_found("no such file of the dashboard; the page is at /ui").into_response()
        }
    }
}

fn file(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    let mut set = |name: HeaderName, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(header::CONTENT_TYPE, content_type);
    set(header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY);
    set(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(header::X_FRAME_OPTIONS, "DENY");
    set(header::REFERRER_POLICY, "no-referrer");
    // The files change with the binary: revalidate rather than run an old script against a
    // newer server.
    set(header::CACHE_CONTROL, "no-cache");
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    async fn body_text(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        String::from_utf8(bytes.to_vec()).expect("UTF-8")
    }

    fn header(response: &Response, name: HeaderName) -> &str {
        response
            .headers()
            .get(&name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_else(|| panic!("no {name} header"))
    }

    #[tokio::test]
    async fn every_file_has_its_type_and_the_safety_headers() {
        let files = [
            (index().await, "text/html; charset=utf-8"),
            (
                asset(Path("app.js".into())).await,
                "text/javascript; charset=utf-8",
            ),
            (
                asset(Path("style.css".into())).await,
                "text/css; charset=utf-8",
            ),
            (asset(Path("favicon.svg".into())).await, "image/svg+xml"),
        ];
        for (response, content_type) in files {
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(header(&response, header::CONTENT_TYPE), content_type);
            let policy = header(&response, header::CONTENT_SECURITY_POLICY);
            assert!(policy.starts_with("default-src 'self'"), "{policy}");
            assert!(!policy.contains("unsafe"), "{policy}");
            assert_eq!(header(&response, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        }
    }

    #[tokio::test]
    async fn an_unknown_file_is_a_json_404() {
        let response = asset(Path("../lib.rs".into())).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert!(body_text(response).await.contains("not_found"));
    }

    /// The policy forbids inline script and style: the page must need neither, and every
    /// file it names must be one this module serves.
    #[tokio::test]
    async fn the_page_has_no_inline_script_or_style_and_loads_only_served_files() {
        let page = body_text(index().await).await;
        assert!(!page.contains(" style="), "an inline style attribute");
        assert!(!page.contains("<style"), "an inline style element");
        for (at, _) in page.match_indices(" on") {
            let rest = &page[at + 3..];
            let word = rest.len()
                - rest
                    .trim_start_matches(|c: char| c.is_ascii_lowercase())
                    .len();
            assert!(
                !rest[word..].starts_with('='),
                "an inline event handler: {}",
                &page[at..at + 3 + word]
            );
        }
        for (at, _) in page.match_indices("<script") {
            let tag = &page[at..at + page[at..].find('>').expect("a closed tag")];
            assert!(tag.contains(" src="), "an inline script: {tag}");
        }
        for attribute in ["src=\"", "href=\""] {
            for (at, _) in page.match_indices(attribute) {
                let start = at + attribute.len();
                let url = &page[start..start + page[start..].find('"').expect("a closed value")];
                let name = url.strip_prefix("ui/").expect("a file of the dashboard");
                let response = asset(Path(name.to_owned())).await;
                assert_eq!(response.status(), StatusCode::OK, "{url}");
            }
        }
    }
}
