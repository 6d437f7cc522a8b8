//! Tests that run anywhere (probing and opening must not panic without CUDA) and, with
//! `--ignored`, the shared device on a real GPU.

use super::*;

#[test]
fn probe_without_cuda_is_an_error_not_a_panic() {
    let r = std::panic::catch_unwind(probe);
    let r = r.expect("probe() must never panic");
    println!("probe: {r:?}");
    if !driver_present() {
        let e = r.expect_err("no libcuda here, so no devices");
        assert!(e.contains("CUDA driver library not found"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn check_libraries_never_panics() {
    let r = std::panic::catch_unwind(check_libraries).expect("check_libraries() must never panic");
    println!("check_libraries: {r:?}");
    if !driver_present() {
        assert!(r.is_err());
    }
}

#[test]
fn opening_without_cuda_is_an_error_not_a_panic() {
    if driver_present() {
        return;
    }
    let r = std::panic::catch_unwind(|| CudaDevice::open(0)).expect("open() must never panic");
    let e = r.expect_err("no libcuda here");
    assert!(e.to_string().starts_with("opening CUDA device 0"), "{e}");
}

/// Device 0 opened once: its stream and cuBLAS handle work, and clones of the `Arc` are the
/// same device. Run on a GPU machine with
/// `cargo test -p gpusanity-cuda -- --ignored --nocapture`.
#[test]
#[ignore = "needs a CUDA GPU and cuBLAS"]
fn gpu_device_opens_once_and_is_shared() {
    check_libraries().ok();
    let dev = CudaDevice::open(0).unwrap();
    println!("device {}: {} sm_{:?}", dev.ordinal(), dev.name(), dev.compute_capability().unwrap());
    let other = Arc::clone(&dev);
    assert!(Arc::ptr_eq(other.stream(), dev.stream()));
    assert_eq!(other.blas().handle(), dev.blas().handle());
    let x = dev.stream().clone_htod(&[1.0f32, 2.0, 3.0]).unwrap();
    let back = other.stream().clone_dtoh(&x).unwrap();
    other.stream().synchronize().unwrap();
    assert_eq!(back, vec![1.0, 2.0, 3.0]);
}
