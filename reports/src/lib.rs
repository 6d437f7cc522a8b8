//! Renders a [`Report`](gpusanity_common::report::Report) for people: the terminal summary and the
//! HTML page (the service's report browser serves the page from `gpusanity-service`).

pub mod columns;
pub mod html;
pub mod lenient;
pub mod svg;
pub mod text;
pub mod validate;
