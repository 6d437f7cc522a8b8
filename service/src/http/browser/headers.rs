//! The security headers of every browser response, set once as layers on the browser's router.
//!
//! The pages run no script and load nothing from elsewhere: their CSS sits in `<style>` blocks
//! and a few `style` attributes (hence `style-src 'unsafe-inline'`, the only source allowed
//! besides same-origin images such as a favicon), their charts are inline SVG, and their only
//! forms post back to `/ui`. So the policy forbids script, plugins, frames, fonts and
//! connections outright, forms may only post here, and no page may sit in another site's frame.
//!
//! `Referrer-Policy` is `same-origin`, not `no-referrer`: under `no-referrer` a browser sends
//! `Origin: null` with a form's POST, and the login and logout forms check that their POST
//! comes from this origin ([`super::auth`]).

use axum::http::{header, HeaderName, HeaderValue};
use axum::Router;
use tower_http::set_header::SetResponseHeaderLayer;

/// The Content-Security-Policy of every page.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Every header the browser's responses carry, with its value.
pub const HEADERS: [(HeaderName, &str); 5] = [
    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "same-origin"),
    // The pages show a workspace's runs to whoever logged in: no cache (the browser's, or a
    // proxy's) keeps them past the session.
    (header::CACHE_CONTROL, "no-store"),
];

/// `router` with [`HEADERS`] on every response (replacing a value a handler set).
pub fn secured<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    HEADERS.into_iter().fold(router, |r, (name, value)| {
        r.layer(SetResponseHeaderLayer::overriding(name, HeaderValue::from_static(value)))
    })
}
