//! A kubelet's PodResources API of the tests' own: `v1.PodResourcesLister/List` served over a
//! Unix socket in a temporary directory, with the real protocol (HTTP/2, gRPC framing, the
//! kubelet's protobuf messages of `gpusanity_kube::podres::proto`). The service is written as
//! tonic-build would generate it for one unary method; any other method is `Unimplemented`.
//! It answers the allocations it was given, or a gRPC error, late, or a great many devices, as
//! the test says. Stopped when dropped.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use gpusanity_kube::podres::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use tonic::codegen::tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

/// One container's devices of one resource: (namespace, pod, container, resource, device ids).
pub type Allocation<'a> = (&'a str, &'a str, &'a str, &'a str, &'a [&'a str]);

/// What the next `List` calls are answered with.
#[derive(Default)]
struct State {
    pods: Vec<PodResources>,
    fail: Option<(Code, String)>,
    delay: Duration,
    calls: usize,
}

/// A PodResources server on a Unix socket of its own; stopped when dropped.
pub struct PodResourcesServer {
    socket: PathBuf,
    state: Arc<Mutex<State>>,
    runtime: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl PodResourcesServer {
    /// Serves `allocations` (in that order: pods as first named, their containers likewise)
    /// on `kubelet.sock` in a new temporary directory. Runs on a runtime of its own, so it
    /// serves plain and async tests alike; the socket accepts once this returns.
    pub fn start(allocations: &[Allocation]) -> PodResourcesServer {
        let dir = tempfile::Builder::new().prefix("podres").tempdir().expect("temporary directory");
        let socket = dir.path().join("kubelet.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind the PodResources socket");
        listener.set_nonblocking(true).expect("non-blocking socket");
        let state = Arc::new(Mutex::new(State { pods: pods(allocations), ..State::default() }));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("podres-server")
            .enable_all()
            .build()
            .expect("the server's runtime");
        let lister = Lister(state.clone());
        runtime.spawn(async move {
            let listener = tokio::net::UnixListener::from_std(listener).expect("the socket on the runtime");
            let incoming = UnixListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder().serve_with_incoming(lister, incoming).await {
                eprintln!("PodResources test server: {e}");
            }
        });
        PodResourcesServer { socket, state, runtime: Some(runtime), _dir: dir }
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Answers `allocations` from now on.
    pub fn set(&self, allocations: &[Allocation]) {
        self.state().pods = pods(allocations);
    }

    /// Answers one pod whose one container `main` holds `n` devices of `resource`
    /// (`GPU-000000`, `GPU-000001`, ...).
    pub fn many_devices(&self, namespace: &str, pod: &str, resource: &str, n: usize) {
        let ids: Vec<String> = (0..n).map(|i| format!("GPU-{i:06}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.set(&[(namespace, pod, "main", resource, &ids)]);
    }

    /// Answers every call with this gRPC error from now on.
    pub fn fail_with(&self, code: Code, message: &str) {
        self.state().fail = Some((code, message.to_string()));
    }

    /// Answers again after [`fail_with`](Self::fail_with).
    pub fn recover(&self) {
        self.state().fail = None;
    }

    /// Waits this long before each answer from now on.
    pub fn delay(&self, delay: Duration) {
        self.state().delay = delay;
    }

    /// How many `List` calls arrived.
    pub fn calls(&self) -> usize {
        self.state().calls
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        // Without waiting for a delayed answer; allowed inside an async test too.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The kubelet's messages for `allocations`.
fn pods(allocations: &[Allocation]) -> Vec<PodResources> {
    let mut pods: Vec<PodResources> = Vec::new();
    for &(namespace, pod, container, resource, ids) in allocations {
        let p = match pods.iter().position(|p| p.namespace == namespace && p.name == pod) {
            Some(i) => &mut pods[i],
            None => {
                pods.push(PodResources { name: pod.into(), namespace: namespace.into(), containers: Vec::new() });
                pods.last_mut().expect("just pushed")
            }
        };
        let c = match p.containers.iter().position(|c| c.name == container) {
            Some(i) => &mut p.containers[i],
            None => {
                p.containers.push(ContainerResources { name: container.into(), ..Default::default() });
                p.containers.last_mut().expect("just pushed")
            }
        };
        c.devices.push(ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            topology: None,
        });
    }
    pods
}

/// The service `v1.PodResourcesLister`.
#[derive(Clone)]
struct Lister(Arc<Mutex<State>>);

impl NamedService for Lister {
    const NAME: &'static str = "v1.PodResourcesLister";
}

/// Its method `List`.
struct List(Arc<Mutex<State>>);

impl UnaryService<ListPodResourcesRequest> for List {
    type Response = ListPodResourcesResponse;
    type Future = BoxFuture<Response<ListPodResourcesResponse>, Status>;

    fn call(&mut self, _: Request<ListPodResourcesRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let (delay, answer) = {
                let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
                s.calls += 1;
                let answer = match &s.fail {
                    Some((code, message)) => Err(Status::new(*code, message.clone())),
                    None => Ok(ListPodResourcesResponse { pod_resources: s.pods.clone() }),
                };
                (s.delay, answer)
            };
            tokio::time::sleep(delay).await;
            answer.map(Response::new)
        })
    }
}

impl<B> Service<http::Request<B>> for Lister
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            "/v1.PodResourcesLister/List" => {
                let method = List(self.0.clone());
                Box::pin(async move {
                    let codec = ProstCodec::<ListPodResourcesResponse, ListPodResourcesRequest>::default();
                    Ok(Grpc::new(codec).unary(method, req).await)
                })
            }
            _ => Box::pin(async { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}
