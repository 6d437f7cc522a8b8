use super::*;

fn h200_node() -> NvidiaHardware {
    NvidiaHardware { driver_loaded: true, dev_nodes: vec!["nvidia0".into()], pci_gpus: vec!["0000:19:00.0".into()] }
}

fn bare_node() -> NvidiaHardware {
    NvidiaHardware::default()
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn probe(cuda: Result<Vec<String>, String>, hardware: fn() -> NvidiaHardware) -> impl FnOnce() -> Probe {
    move || Probe { cuda, libraries: Ok(()), hardware }
}

fn no_cuda() -> Result<Vec<String>, String> {
    Err("CUDA driver initialisation failed: CUDA_ERROR_NO_DEVICE".into())
}

fn one_h200() -> Result<Vec<String>, String> {
    Ok(vec!["NVIDIA H200".into()])
}

#[test]
fn auto_falls_back_to_the_cpu_only_on_a_node_without_nvidia_hardware() {
    let e = env(&[]);
    let at = Place { node_rank: 0, host: "gpu-a", env: &e };
    match resolve(DeviceChoice::Auto, probe(no_cuda(), bare_node), None, &at) {
        Resolved::Cpu(why) => assert!(why.contains("no NVIDIA hardware"), "{why}"),
        other => panic!("{other:?}"),
    }
    // The same CUDA failure on a node with an NVIDIA GPU fails the node, naming it, the GPU's
    // PCI bus id, the error and the device variable that hid it.
    let e = env(&[("CUDA_VISIBLE_DEVICES", "7")]);
    let at = Place { node_rank: 0, host: "gpu-a", env: &e };
    for choice in [DeviceChoice::Auto, DeviceChoice::Cuda] {
        let Resolved::NotReady(f) = resolve(choice, probe(no_cuda(), h200_node), None, &at) else {
            panic!("{choice}: a GPU node whose CUDA fails must not pass");
        };
        assert_eq!(f.len(), 1);
        assert_eq!(
            (f[0].code.as_str(), f[0].severity, f[0].node_rank),
            ("NODE_GPU_UNUSABLE", Severity::Critical, Some(0))
        );
        assert_eq!(f[0].host.as_deref(), Some("gpu-a"));
        for part in ["gpu-a", "0000:19:00.0", "CUDA_ERROR_NO_DEVICE"] {
            assert!(f[0].message.contains(part), "{part} not in {}", f[0].message);
        }
        assert!(f[0].evidence.iter().any(|l| l == "CUDA_VISIBLE_DEVICES=7"), "{:?}", f[0].evidence);
    }
}

#[test]
fn cuda_asked_on_a_node_without_gpus_fails_the_node_and_cpu_never_probes() {
    let e = env(&[]);
    let at = Place { node_rank: 2, host: "cpu-b", env: &e };
    let Resolved::NotReady(f) = resolve(DeviceChoice::Cuda, probe(no_cuda(), bare_node), None, &at) else {
        panic!("--device cuda without a GPU must fail the node");
    };
    assert_eq!((f[0].code.as_str(), f[0].node_rank), ("NODE_NO_GPU", Some(2)));
    let never = || -> Probe { panic!("--device cpu must not probe CUDA") };
    assert!(matches!(resolve(DeviceChoice::Cpu, never, None, &at), Resolved::Cpu(_)));
}

#[test]
fn incomplete_cuda_libraries_fail_a_gpu_node() {
    let e = env(&[]);
    let at = Place { node_rank: 0, host: "gpu-a", env: &e };
    let p = || Probe { cuda: one_h200(), libraries: Err("libnccl.so: not found".into()), hardware: h200_node };
    let Resolved::NotReady(f) = resolve(DeviceChoice::Auto, p, None, &at) else { panic!("must fail") };
    assert_eq!(f[0].code, Code::NodeGpuUnusable);
    assert!(f[0].message.contains("libnccl.so"), "{}", f[0].message);
}

#[test]
fn fewer_usable_gpus_than_asked_names_the_missing_ones() {
    let e = env(&[("SLURM_JOB_GPUS", "0,1,2,3")]);
    let at = Place { node_rank: 0, host: "gpu-a", env: &e };
    let asked = asked_gpus(Some(2), None, &e).unwrap();
    assert_eq!(asked, Asked { count: 4, source: "SLURM_JOB_GPUS=0,1,2,3".into() });
    let two = || Ok(vec!["NVIDIA H200".to_string(), "NVIDIA H200".to_string()]);
    let Resolved::NotReady(f) = resolve(DeviceChoice::Auto, probe(two(), h200_node), Some(&asked), &at) else {
        panic!("2 of 4 GPUs must fail");
    };
    assert_eq!(f[0].code, Code::NodeGpusMissing);
    assert!(f[0].message.contains("local GPU(s) 2, 3 missing"), "{}", f[0].message);
    assert!(f[0].message.contains("SLURM_JOB_GPUS"), "{}", f[0].message);
    assert_eq!((f[0].measured, f[0].expected), (Some(2.0), Some(4.0)));
    // As many as asked: CUDA.
    let enough = Asked { count: 1, source: "--nproc-per-node".into() };
    assert!(matches!(resolve(DeviceChoice::Auto, probe(one_h200(), h200_node), Some(&enough), &at), Resolved::Cuda(_)));
}

#[test]
fn the_asked_count_is_the_largest_source_and_hostile_values_are_ignored() {
    assert_eq!(asked_gpus(None, None, &env(&[])), None);
    let a = asked_gpus(Some(2), Some(8), &env(&[("SLURM_GPUS_ON_NODE", "4")])).unwrap();
    assert_eq!(a, Asked { count: 8, source: "gpu-health.expected-gpus".into() });
    let a = asked_gpus(None, None, &env(&[("SLURM_GPUS_ON_NODE", " 3 ")])).unwrap();
    assert_eq!(a.count, 3);
    let huge = "0,".repeat(5000);
    for bad in [
        ("SLURM_GPUS_ON_NODE", "99999999999999999999"),
        ("SLURM_GPUS_ON_NODE", "-1"),
        ("SLURM_GPUS_ON_NODE", "4096"),
        ("SLURM_JOB_GPUS", "0,x"),
        ("SLURM_JOB_GPUS", huge.as_str()),
    ] {
        assert_eq!(asked_gpus(None, None, &env(&[bad])), None, "{bad:?}");
    }
}
