//! `GET /openapi.json`: the OpenAPI document, derived from the handlers' annotations and the
//! wire types themselves.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api;
use crate::error::{ErrorBody, ErrorDetail};

struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Tollgate HTTP API", version = "1",
        description = "Rate-limit and quota coordination. Errors are {\"error\": {\"code\", \"message\"}}."),
    paths(
        api::list_limits, api::get_limit, api::put_limit, api::delete_limit,
        api::acquire, api::commit, api::renew, api::pause, api::check, crate::stats::stats,
        api::healthz, api::readyz,
    ),
    components(schemas(
        ErrorBody, ErrorDetail, tollgate_rules::RawRule, tollgate_rules::RawReserve,
        tollgate_rules::RawMatch,
    )),
    modifiers(&BearerScheme),
)]
pub(crate) struct ApiDoc;

pub(crate) fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
