//! The OpenAPI 3.1 document of the `/v1` routes, built from the `#[utoipa::path]` annotations
//! on the handlers themselves.

use axum::response::{IntoResponse, Response};
use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::ErrorBody;
use super::{browser, rules, runs};

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "gpusanity service API", description = "Runs, reports, node history and notification rules of `gpusanity serve`. Every route needs `Authorization: Bearer TOKEN`: the admin token sees every workspace, a workspace token only its own (a run or rule of another workspace answers 404, as a missing one does)."),
    paths(
        browser::api::runs,
        runs::run,
        runs::report,
        runs::resolve,
        browser::api::node_history,
        browser::api::node_reputation,
        browser::figures::figures,
        browser::fleet::fleet,
        openapi_json,
        rules::list,
        rules::create,
        rules::show,
        rules::update,
        rules::remove,
        rules::deliveries,
    ),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
struct Doc;

/// The OpenAPI 3.1 document of the `/v1` routes.
pub fn openapi() -> utoipa::openapi::OpenApi {
    Doc::openapi()
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "The OpenAPI 3.1 document"),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn openapi_json() -> Response {
    Json(openapi()).into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_document_covers_every_v1_route() {
        let doc = serde_json::to_value(super::openapi()).unwrap();
        for p in [
            "/v1/runs",
            "/v1/runs/{run_id}",
            "/v1/runs/{run_id}/report",
            "/v1/runs/{run_id}/resolve",
            "/v1/nodes/{name}/history",
            "/v1/nodes/{name}/reputation",
            "/v1/nodes/{name}/figures",
            "/v1/fleet",
            "/v1/openapi.json",
            "/v1/workspaces/{ws}/notification-rules",
            "/v1/workspaces/{ws}/notification-rules/{id}",
            "/v1/workspaces/{ws}/deliveries",
        ] {
            assert!(doc["paths"][p].is_object(), "{p} missing from the OpenAPI document");
        }
        assert!(doc["components"]["schemas"]["ApiError"]["properties"]["error"].is_object(), "{doc:#}");
        assert!(doc["components"]["schemas"]["RunListRow"]["properties"]["faulty_nodes"].is_object(), "{doc:#}");
    }
}
