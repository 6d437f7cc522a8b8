//! The job's GPUs from the kubelet: the PodResources client against a server speaking the
//! kubelet's protocol on a Unix socket (testkit's `PodResourcesServer`), and the selection of
//! the job's pods on a node against a real kube-apiserver (scripts/kube-apiserver.sh; skipped,
//! counted, where none can be started).

use std::time::{Duration, Instant};

use gpusanity_kube::podres::*;
use gpusanity_kube::ClientSettings;
use gpusanity_testkit::podres::PodResourcesServer;
use gpusanity_testkit::svc::kube::{bound_pod, kube_server, namespace, unique};

const T: Duration = Duration::from_secs(5);

fn pod(namespace: &str, name: &str) -> PodRef {
    PodRef { namespace: namespace.into(), name: name.into() }
}

/// Two pods of the job with two containers each, another resource beside the GPUs, a GPU
/// named twice, and a pod of another job between them.
fn two_pods() -> PodResourcesServer {
    PodResourcesServer::start(&[
        ("train", "w0", "trainer", GPU_RESOURCE, &["GPU-b", "GPU-a"]),
        ("train", "other-job", "trainer", GPU_RESOURCE, &["GPU-x"]),
        ("train", "w0", "sidecar", "rdma/hca", &["mlx5_0"]),
        ("train", "w0", "sidecar", GPU_RESOURCE, &["GPU-c"]),
        ("train", "w1", "trainer", GPU_RESOURCE, &["GPU-d", "GPU-a"]),
        ("train", "w1", "sidecar", GPU_RESOURCE, &["GPU-e"]),
    ])
}

#[tokio::test]
async fn the_devices_of_the_jobs_pods_in_the_kubelets_order_each_once() {
    let server = two_pods();
    let want = ["GPU-b", "GPU-a", "GPU-c", "GPU-d", "GPU-e"];
    let got = list_devices(server.socket(), &[pod("train", "w0"), pod("train", "w1")], GPU_RESOURCE, T).await;
    assert_eq!(got.expect("devices"), want);
    // The order is the kubelet's, not the caller's.
    let got = list_devices(server.socket(), &[pod("train", "w1"), pod("train", "w0")], GPU_RESOURCE, T).await;
    assert_eq!(got.expect("devices"), want);
    let got = list_devices(server.socket(), &[pod("train", "w0")], "rdma/hca", T).await;
    assert_eq!(got.expect("devices"), ["mlx5_0"]);
    // Same name, another namespace: not the job's pod.
    let got = list_devices(server.socket(), &[pod("other", "w0")], GPU_RESOURCE, T).await;
    assert!(got.expect("devices").is_empty());
    assert_eq!(server.calls(), 4);
}

#[tokio::test]
async fn a_missing_socket_is_an_error_naming_it() {
    let dir = tempfile_dir();
    let path = dir.join("pod-resources/kubelet.sock");
    let e = list_devices(&path, &[pod("a", "b")], GPU_RESOURCE, T).await.expect_err("no socket");
    assert!(matches!(&e, PodResourcesError::SocketMissing(p) if *p == path), "{e:?}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");

    // A socket file that nobody listens on (a kubelet that stopped): unreachable.
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    let e = list_devices(&stale, &[pod("a", "b")], GPU_RESOURCE, T).await.expect_err("nobody listens");
    assert!(matches!(&e, PodResourcesError::Unreachable { path, .. } if *path == stale), "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_grpc_error_is_the_typed_error_with_its_code() {
    let server = two_pods();
    server.fail_with(Code::Unavailable, "the kubelet is restarting");
    let e = list_devices(server.socket(), &[pod("train", "w0")], GPU_RESOURCE, T).await.expect_err("Unavailable");
    assert!(
        matches!(&e, PodResourcesError::Status { code: Code::Unavailable, message } if message == "the kubelet is restarting"),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_kubelet_that_does_not_answer_is_a_timeout_within_the_bound() {
    let server = two_pods();
    server.delay(Duration::from_secs(30));
    let bound = Duration::from_millis(300);
    let start = Instant::now();
    let e = list_devices(server.socket(), &[pod("train", "w0")], GPU_RESOURCE, bound).await.expect_err("timeout");
    let took = start.elapsed();
    assert!(matches!(&e, PodResourcesError::Timeout { after, .. } if *after == bound), "{e:?}");
    assert!(took >= bound && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(server.calls(), 1, "the call reached the server");
}

#[tokio::test]
async fn more_than_the_bound_of_devices_is_an_error() {
    let server = two_pods();
    server.many_devices("train", "w0", GPU_RESOURCE, 2000);
    let e = list_devices(server.socket(), &[pod("train", "w0")], GPU_RESOURCE, T).await.expect_err("2000 devices");
    assert!(matches!(&e, PodResourcesError::TooManyDevices { limit: MAX_DEVICES, .. }), "{e:?}");
    server.many_devices("train", "w0", GPU_RESOURCE, MAX_DEVICES);
    let got = list_devices(server.socket(), &[pod("train", "w0")], GPU_RESOURCE, T).await;
    assert_eq!(got.expect("at the bound").len(), MAX_DEVICES);
}

#[tokio::test]
async fn a_forged_device_id_is_an_error_naming_the_pod() {
    let server = two_pods();
    server.set(&[("train", "w0", "trainer", GPU_RESOURCE, &["GPU-a", "GPU-\u{1b}[2J\n"])]);
    let e = list_devices(server.socket(), &[pod("train", "w0")], GPU_RESOURCE, T).await.expect_err("forged");
    assert!(
        matches!(&e, PodResourcesError::BadDeviceId { namespace, pod, .. } if namespace == "train" && pod == "w0"),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.contains("train/w0") && !text.contains('\u{1b}') && !text.contains('\n'), "{text}");
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique("podres-missing"));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}

async fn admin() -> Option<kube::Client> {
    let server = kube_server()?;
    let settings = ClientSettings { kubeconfig: Some(server.kubeconfig.clone()), ..Default::default() };
    Some(settings.client().await.expect("admin client"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_jobs_running_pods_on_this_node_in_any_namespace() {
    let Some(client) = admin().await else { return };
    let (ns1, ns2) = (namespace(&client).await, namespace(&client).await);
    let (job, other_job) = (unique("job"), unique("job"));
    let (node, other_node) = (unique("gpu"), unique("gpu"));
    bound_pod(&client, &ns1, "w0", &node, Some(&job), Some("Running")).await;
    bound_pod(&client, &ns2, "w1", &node, Some(&job), None).await; // Pending
    bound_pod(&client, &ns1, "elsewhere", &other_node, Some(&job), None).await;
    bound_pod(&client, &ns2, "other", &node, Some(&other_job), None).await;
    bound_pod(&client, &ns1, "unlabelled", &node, None, None).await;
    bound_pod(&client, &ns1, "done", &node, Some(&job), Some("Succeeded")).await;
    bound_pod(&client, &ns2, "failed", &node, Some(&job), Some("Failed")).await;

    let mut got = job_pods_on_node(&client, &node, &job).await.expect("the job's pods");
    got.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    assert_eq!(got, [pod(&ns1, "w0"), pod(&ns2, "w1")]);
    assert_eq!(job_pods_on_node(&client, &other_node, &job).await.expect("other node"), [pod(&ns1, "elsewhere")]);
    assert_eq!(job_pods_on_node(&client, &node, &other_job).await.expect("other job"), [pod(&ns2, "other")]);

    // Both together: the kubelet of `node` lists every pod of the node; only the job's count.
    let kubelet = PodResourcesServer::start(&[
        (&ns2, "other", "trainer", GPU_RESOURCE, &["GPU-0", "GPU-1"]),
        (&ns1, "w0", "trainer", GPU_RESOURCE, &["GPU-2", "GPU-3"]),
        (&ns1, "done", "trainer", GPU_RESOURCE, &["GPU-6"]),
        (&ns2, "w1", "trainer", GPU_RESOURCE, &["GPU-4", "GPU-5"]),
    ]);
    let gpus = job_gpus_on_node(&client, kubelet.socket(), &node, &job, T).await.expect("the job's GPUs");
    assert_eq!(gpus, ["GPU-2", "GPU-3", "GPU-4", "GPU-5"]);

    // No pod of the job here: empty, and the kubelet is not asked.
    let calls = kubelet.calls();
    let none = job_gpus_on_node(&client, kubelet.socket(), &node, &unique("job"), T).await.expect("no pods");
    assert!(none.is_empty());
    assert_eq!(kubelet.calls(), calls);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_id_that_is_no_label_value_is_refused_before_any_request() {
    // Refused before the client is used, so an unreachable API server does for this test.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    let long = "j".repeat(64);
    for bad in ["", "job 1", "job,x=y", "-job", "job\n", "jöb", long.as_str()] {
        let e = job_pods_on_node(&client, "node-1", bad).await.expect_err(bad);
        assert!(matches!(&e, PodResourcesError::BadJobId(id) if bad.starts_with(id.as_str())), "{bad:?}: {e:?}");
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    for bad in ["", "Node", "a,spec.nodeName=b", "a b"] {
        let e = job_pods_on_node(&client, bad, "job-1").await.expect_err(bad);
        assert!(matches!(&e, PodResourcesError::BadNodeName(_)), "{bad:?}: {e:?}");
    }
}

/// The test's kubelet answers only `List`, as tonic-build's server would: another method of
/// the service is `Unimplemented`.
#[tokio::test]
async fn the_test_kubelet_answers_other_methods_unimplemented() {
    use gpusanity_kube::podres::proto::{ListPodResourcesRequest, ListPodResourcesResponse};
    let server = two_pods();
    let socket = server.socket().to_path_buf();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move { tokio::net::UnixStream::connect(socket).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/v1.PodResourcesLister/GetAllocatableResources");
    let e = grpc.unary(tonic::Request::new(ListPodResourcesRequest {}), path, codec).await.expect_err("unimplemented");
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    assert_eq!(server.calls(), 0);
}
