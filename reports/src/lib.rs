//! Renders a [`Report`](gpusanity_common::report::Report) for people.

pub mod text;
