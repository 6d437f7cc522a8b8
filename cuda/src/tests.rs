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

/// Device 0 opened once: its stream and cuBLAS handle work through every clone of the `Arc`.
/// Run on a GPU machine with `cargo test -p gpusanity-cuda -- --ignored --nocapture`.
#[test]
#[ignore = "needs a CUDA GPU and cuBLAS"]
fn gpu_device_opens_once_and_is_shared() {
    use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
    println!("check_libraries: {:?}", check_libraries());
    let dev = CudaDevice::open(0).unwrap();
    println!("device {}: {} {:?}", dev.ordinal(), dev.name(), dev.compute_capability().unwrap());
    let other = Arc::clone(&dev);
    assert!(Arc::ptr_eq(other.stream(), dev.stream()));
    // [[1, 3], [2, 4]] (column-major) times 2 I, on the shared handle and stream.
    let a = dev.stream().clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let b = dev.stream().clone_htod(&[2.0f32, 0.0, 0.0, 2.0]).unwrap();
    let mut c = other.stream().alloc_zeros::<f32>(4).unwrap();
    let n = cublasOperation_t::CUBLAS_OP_N;
    let cfg = GemmConfig { transa: n, transb: n, m: 2, n: 2, k: 2, alpha: 1.0, lda: 2, ldb: 2, beta: 0.0, ldc: 2 };
    // SAFETY: 2x2 f32 matrices with leading dimension 2, all three buffers of 4 elements on
    // the handle's stream; c aliases neither a nor b.
    unsafe { other.blas().gemm(cfg, &a, &b, &mut c) }.unwrap();
    let back = dev.stream().clone_dtoh(&c).unwrap();
    dev.stream().synchronize().unwrap();
    assert_eq!(back, vec![2.0, 4.0, 6.0, 8.0]);
}
