//! Renders a [`Report`](gpusanity_common::report::Report) for people: the terminal summary and
//! the HTML page.

pub mod columns;
pub mod html;
pub mod svg;
pub mod text;
