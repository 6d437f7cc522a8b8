//! Renders a [`Report`](gpusanity_common::report::Report) for people: the terminal summary, the
//! HTML page, and the service's report browser.

pub mod browser;
pub mod columns;
pub mod html;
pub mod svg;
pub mod text;
