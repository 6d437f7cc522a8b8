//! Support for the gpusanity integration tests, shared by the test binaries of the root
//! package (tests/check, tests/service, tests/testbed): [`common`] runs the real `gpusanity`
//! binary with a deadline, reads its report and finds the processes it left; [`svc`] is one
//! test's world of the service (a Kafka broker, topics of its own, a database, `gpusanity
//! serve` and `gpusanity agent` processes) with notification receivers and an SMTP server;
//! [`skip`] decides whether a test that lacks a prerequisite skips (counted) or fails;
//! [`manifests`] reads the Kubernetes manifests of deploy/kubernetes/; [`image`] runs the
//! gpusanity image that scripts/image.sh built, with podman; [`podres`] is a kubelet's
//! PodResources API on a Unix socket.

use std::path::Path;

pub mod common;
pub mod image;
pub mod manifests;
pub mod podres;
pub mod skip;
pub mod svc;

/// The repository's root (this crate lies in `testkit/` of it): its `scripts/` start the
/// services the tests use.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testkit/ lies in the repository")
}
