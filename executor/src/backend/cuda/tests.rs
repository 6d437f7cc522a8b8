//! Tests that run anywhere and, with `--ignored`, a one-rank smoke test on a real GPU (the
//! probing tests are with the `gpusanity-cuda` crate).

use std::ffi::c_char;
use std::time::Duration;

use super::*;
use crate::backend::{CollCall, CollOp};

#[test]
fn nccl_id_round_trips_through_hex() {
    let mut id = [0 as c_char; 128];
    for (i, c) in id.iter_mut().enumerate() {
        *c = (i * 37 % 256) as u8 as c_char;
    }
    let hex = nccl::encode_id(&id);
    assert_eq!(hex.len(), 256);
    assert_eq!(nccl::decode_id(&hex).unwrap(), id);
    assert!(nccl::decode_id("abc").is_err());
    assert!(nccl::decode_id(&"zz".repeat(128)).is_err());
}

#[test]
fn bf16_bytes_are_little_endian() {
    assert_eq!(bf16_bytes(&[bf16::from_f32(1.0), bf16::from_bits(0x1234)]), vec![0x80, 0x3f, 0x34, 0x12]);
}

/// One rank on GPU 0: GEMM against an f64 host reference and an all-reduce of one rank
/// (output = input). Run on a GPU machine with
/// `cargo test -p gpusanity-executor cuda -- --ignored --nocapture`.
#[test]
#[ignore = "needs a CUDA GPU, cuBLAS and NCCL"]
fn gpu_smoke_one_rank() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    rt.spawn(crate::store::serve(listener, None));
    let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
    let place = WorkerPlace::single_node(0, 1);
    println!("probe: {:?}", probe());
    let mut be = CudaBackend::new(&place, &mut store).unwrap();
    println!("device: {}", be.device_name());

    // GEMM with small integers: exact in bf16 inputs; sums <= 8*8*n stay exact in fp32.
    let n = 512;
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 + 3) % 17) as f32 - 8.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5 + 1) % 13) as f32 - 6.0).collect();
    be.gemm_load(n, &a, &b).unwrap();
    let times = be.gemm_run(5).unwrap();
    println!("gemm {n}: {times:?}");
    assert!(times.len() == 5 && times.iter().all(|&t| t > 0.0 && t < 1.0));
    let c = be.gemm_output().unwrap();
    assert_eq!(c.len(), n * n * 2);
    let mut bad = 0;
    for (r, col) in [(0, 0), (1, 2), (n - 1, n - 1), (17, 300), (400, 3)] {
        let want: f64 = (0..n).map(|k| a[r * n + k] as f64 * b[k * n + col] as f64).sum();
        let got = Dtype::Bf16.decode(&c, r * n + col) as f64;
        if (got - Dtype::Bf16.round(want as f32) as f64).abs() > 0.0 {
            println!("C[{r}][{col}] = {got}, want {want}");
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "C must be A·B row-major");
    be.gemm_free();

    // Big enough to check the doubling fill; the period is not a power of two.
    let period: Vec<u8> = (0..251u8).collect();
    let max = 3 << 20;
    let send = be.buf_alloc(max).unwrap();
    let recv = be.buf_alloc(max).unwrap();
    be.buf_fill(send, &period).unwrap();
    be.buf_poison(recv, max).unwrap();
    let call = CollCall::new(CollOp::AllReduce, GroupId::WORLD, send, recv, max - 5);
    let t = be.run(&[Work::Coll(call)], 2, 10).unwrap();
    println!("all-reduce of {} bf16: {:.1} us", max - 5, t.total * 1e6);
    assert!(t.total > 0.0 && t.each.len() == 1);
    let out = be.buf_read(recv, max).unwrap();
    assert_eq!(out.len(), max * 2);
    for i in (0..max - 5).step_by(997).chain([max - 6]) {
        assert_eq!(Dtype::Bf16.decode(&out, i), period[i % period.len()] as f32, "element {i}");
    }
    // The elements past `elems` were never written: still NaN.
    assert!(Dtype::Bf16.decode(&out, max - 1).is_nan());
    // GEMM and an all-reduce at once need distinct streams: the world works on the main one.
    be.gemm_load(n, &a, &b).unwrap();
    assert!(be.run(&[Work::Gemm, Work::Coll(call)], 0, 1).is_err());
    // Empty kernel launches.
    let l = be.kernel_launch(2000).unwrap();
    println!("kernel launch: {l:?}");
    assert!(l.launch_us > 0.0 && l.round_trip_us >= l.round_trip_best_us);
    be.buf_free(recv);
    assert!(matches!(be.buf_read(recv, 1), Err(BackendError::Device(_))));
}

/// The model ops on the backend's device: one context, stream and cuBLAS handle for both,
/// and the backend's GEMM and all-reduce still right after a model product. Run with the
/// smoke test above.
#[test]
#[ignore = "needs a CUDA GPU, cuBLAS, NCCL and NVRTC"]
fn gpu_model_ops_share_the_backend_device() {
    use gpusanity_models::cuda::CudaOps;
    use gpusanity_models::ops::{Mm, Ops};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    rt.spawn(crate::store::serve(listener, None));
    let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
    let mut be = CudaBackend::new(&WorkerPlace::single_node(0, 1), &mut store).unwrap();
    let device = be.cuda_device().expect("a CUDA backend shares its device");
    assert!(Arc::ptr_eq(&device, &be.device));
    let n = 64;
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 + 3) % 17) as f32 - 8.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5 + 1) % 13) as f32 - 6.0).collect();
    let want: Vec<f32> = (0..n * n)
        .map(|i| (0..n).map(|k| a[i / n * n + k] as f64 * b[k * n + i % n] as f64).sum::<f64>() as f32)
        .collect();
    {
        let mut ops = CudaOps::new(device).unwrap();
        assert!(Arc::ptr_eq(ops.stream(), be.device.stream()));
        println!("ops: {}", ops.describe());
        let (ga, gb, mut gc) = (ops.upload(&a).unwrap(), ops.upload(&b).unwrap(), ops.zeros(n * n).unwrap());
        ops.matmul(Mm::new(n, n, n), &ga, &gb, &mut gc).unwrap();
        // Small integers: exact in bf16 inputs with fp32 accumulation.
        assert_eq!(ops.download(&gc).unwrap(), want, "model product on the shared handle");
    }
    assert_eq!(Arc::strong_count(&be.device), 1, "the ops let go of the device");
    be.gemm_load(n, &a, &b).unwrap();
    assert_eq!(be.gemm_run(2).unwrap().len(), 2);
    let c = be.gemm_output().unwrap();
    for i in (0..n * n).step_by(37) {
        assert_eq!(Dtype::Bf16.decode(&c, i), Dtype::Bf16.round(want[i]), "backend GEMM element {i}");
    }
    let period: Vec<u8> = (0..61u8).collect();
    let (send, recv) = (be.buf_alloc(1 << 16).unwrap(), be.buf_alloc(1 << 16).unwrap());
    be.buf_fill(send, &period).unwrap();
    be.buf_poison(recv, 1 << 16).unwrap();
    be.run(&[Work::Coll(CollCall::new(CollOp::AllReduce, GroupId::WORLD, send, recv, 1 << 16))], 1, 2).unwrap();
    let out = be.buf_read(recv, 1 << 16).unwrap();
    assert_eq!(Dtype::Bf16.decode(&out, 100), period[100 % period.len()] as f32);
}

/// Two ranks on GPUs 0 and 1, one thread each (one process): NCCL id exchange through the
/// store, exact sums, and bus bandwidth of a 1 GiB all-reduce; also GEMM throughput. Run on
/// purpose (`--ignored`) with fewer than two GPUs, it fails rather than pass untested.
#[test]
#[ignore = "needs two CUDA GPUs, cuBLAS and NCCL"]
fn gpu_two_ranks() {
    let devices = probe().unwrap_or_default();
    assert!(devices.len() >= 2, "needs two GPUs, found {}", devices.len());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    rt.spawn(crate::store::serve(listener, None));
    std::thread::scope(|s| {
        for rank in 0..2 {
            let addr = addr.clone();
            s.spawn(move || {
                let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
                let place = WorkerPlace::single_node(rank, 2);
                let mut be = CudaBackend::new(&place, &mut store).unwrap();
                let n = 8192;
                let a: Vec<f32> =
                    (0..n * n).map(|i| Dtype::Bf16.round(((i * 7 + 3) % 101) as f32 / 50.0 - 1.0)).collect();
                be.gemm_load(n, &a, &a).unwrap();
                be.gemm_run(3).unwrap();
                let t = be.gemm_run(10).unwrap();
                let best = t.iter().copied().fold(f64::MAX, f64::min);
                println!(
                    "rank {rank}: gemm {n}: best {:.3} ms = {:.0} TFLOP/s",
                    best * 1e3,
                    2.0 * (n as f64).powi(3) / best / 1e12
                );
                be.gemm_free();
                let period: Vec<u8> = (0..128u8).map(|j| (j + 7 * rank as u8) % 128).collect();
                let elems = 512 << 20;
                let send = be.buf_alloc(elems).unwrap();
                let recv = be.buf_alloc(elems).unwrap();
                be.buf_fill(send, &period).unwrap();
                be.buf_poison(recv, elems).unwrap();
                let call = CollCall::new(CollOp::AllReduce, GroupId::WORLD, send, recv, elems);
                let t = be.run(&[Work::Coll(call)], 5, 20).unwrap().total;
                let busbw = 2.0 * (2.0 - 1.0) / 2.0 * (elems * 2) as f64 / t / 1e9;
                println!("rank {rank}: all-reduce {} MiB: {:.3} ms, busbw {busbw:.0} GB/s", (elems * 2) >> 20, t * 1e3);
                let out = be.buf_read(recv, elems).unwrap();
                for i in (0..elems).step_by(9973).chain([elems - 1]) {
                    let want = (i % 128 + (i + 7) % 128) as f32;
                    assert_eq!(Dtype::Bf16.decode(&out, i), want, "rank {rank} element {i}");
                }
                // All-gather and all-to-all of 1 GiB, exact.
                for op in [CollOp::AllGather, CollOp::AllToAll] {
                    be.buf_poison(recv, elems).unwrap();
                    let call = CollCall::new(op, GroupId::WORLD, send, recv, elems);
                    let t = be.run(&[Work::Coll(call)], 5, 20).unwrap().total;
                    println!(
                        "rank {rank}: {op:?} 1 GiB: {:.3} ms, busbw {:.0} GB/s",
                        t * 1e3,
                        0.5 * (elems * 2) as f64 / t / 1e9
                    );
                    let out = be.buf_read(recv, elems).unwrap();
                    let half = elems / 2;
                    for i in (0..elems).step_by(9973).chain([elems - 1]) {
                        let (block, k) = (i / half, i % half);
                        // Block j comes from rank j: its element k (all-gather) or its
                        // element rank * half + k (all-to-all).
                        let src = if op == CollOp::AllGather { k } else { rank * half + k };
                        let want = ((src % 128) as u8 + 7 * block as u8) % 128;
                        assert_eq!(Dtype::Bf16.decode(&out, i), want as f32, "rank {rank} {op:?} element {i}");
                    }
                }
                // Two all-reduces at once on two more world communicators, each on its stream.
                let g1 = be.group(&mut store, "w1", &[0, 1]).unwrap();
                let g2 = be.group(&mut store, "w2", &[0, 1]).unwrap();
                let recv2 = be.buf_alloc(elems).unwrap();
                let mut a1 = CollCall::new(CollOp::AllReduce, g1, send, recv, elems / 4);
                a1.timeout = Some(Duration::from_secs(30));
                let a2 = CollCall::new(CollOp::AllReduce, g2, send, recv2, elems / 4);
                let t = be.run(&[Work::Coll(a1), Work::Coll(a2)], 2, 10).unwrap();
                println!("rank {rank}: two concurrent all-reduces of 256 MiB: {:?}", t);
                for b in [recv, recv2] {
                    let out = be.buf_read(b, elems / 4).unwrap();
                    for i in (0..elems / 4).step_by(9973) {
                        assert_eq!(Dtype::Bf16.decode(&out, i), (i % 128 + (i + 7) % 128) as f32);
                    }
                }
                // GEMM on the main stream with an all-reduce on a group stream.
                be.gemm_load(n, &a, &a).unwrap();
                let t = be.run(&[Work::Gemm, Work::Coll(a1)], 2, 10).unwrap();
                println!("rank {rank}: gemm + all-reduce at once: {:?}", t);
                // Send/recv with the peer.
                let p = CollCall::new(CollOp::SendRecv { peer: 1 - rank }, g2, send, recv2, 1 << 20);
                be.run(&[Work::Coll(p)], 0, 1).unwrap();
                let out = be.buf_read(recv2, 1 << 20).unwrap();
                for i in (0..1 << 20).step_by(997) {
                    assert_eq!(Dtype::Bf16.decode(&out, i), ((i % 128) as u8 + 7 * (1 - rank) as u8) as f32 % 128.0);
                }
                // A peer that never answers: the probe times out, its group is abandoned (the
                // communicator aborted), and other groups go on.
                let g3 = be.group(&mut store, "w3", &[0, 1]).unwrap();
                // Connections are set up on first use, in a blocking host call: both take part.
                let p = CollCall::new(CollOp::SendRecv { peer: 1 - rank }, g3, send, recv2, 1 << 20);
                be.run(&[Work::Coll(p)], 0, 1).unwrap();
                if rank == 0 {
                    let mut p = CollCall::new(CollOp::SendRecv { peer: 1 }, g3, send, recv2, 1 << 20);
                    p.timeout = Some(Duration::from_secs(1));
                    let t = std::time::Instant::now();
                    let e = be.run(&[Work::Coll(p)], 0, 1).unwrap_err();
                    println!("rank 0: silent peer: {e} after {:?}", t.elapsed());
                    assert!(matches!(e, BackendError::Timeout(_)), "{e}");
                    assert!(t.elapsed() < Duration::from_secs(5));
                    let e = be.run(&[Work::Coll(p)], 0, 1).unwrap_err();
                    assert!(e.to_string().contains("abandoned"), "{e}");
                }
                let t = be.run(&[Work::Coll(a2)], 0, 1).unwrap();
                println!("rank {rank}: all-reduce on another group after the timeout: {t:?}");
            });
        }
    });
}

/// One rank on GPU 0: the copy kernel and the host link, each verified exactly, a poked byte
/// found at its word, and figures in a sane range. Run on a GPU machine with
/// `cargo test -p gpusanity-executor gpu_copies -- --ignored --nocapture`.
#[test]
#[ignore = "needs a CUDA GPU and NCCL"]
fn gpu_copies_and_host_link_one_rank() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    rt.spawn(crate::store::serve(listener, None));
    let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
    let mut be = CudaBackend::new(&WorkerPlace::single_node(0, 1), &mut store).unwrap();

    // 64 MiB + 48 bytes: the copy's tail loop runs too.
    let bytes = (64 << 20) + 48;
    be.copy_load(bytes, 11, 8).unwrap();
    assert_eq!(be.copy_verify(11).unwrap().wrong, (bytes / 16), "the destination is still zero");
    for path in be.copy_paths() {
        be.copy_clear().unwrap();
        assert_eq!(be.copy_verify(11).unwrap().wrong, (bytes / 16), "the destination is zero again");
        let t = be.copy_run(*path, 5).unwrap();
        println!("copy {bytes} B ({}): {:.1} GB/s r+w", path.name(), 2.0 * bytes as f64 / t[4] / 1e9);
        assert_eq!(be.copy_verify(11).unwrap(), Verified::default(), "{}", path.name());
    }
    be.copy_poke(1000, !crate::backend::mem::pattern_byte(1000, 11)).unwrap();
    assert_eq!(be.copy_verify(11).unwrap(), Verified { wrong: 1, first: Some(1000 / 16) });
    be.copy_free();

    let bytes = 32 << 20;
    be.host_load(bytes).unwrap();
    be.host_fill(HostSide::Host, Some(5)).unwrap();
    be.host_fill(HostSide::Device, None).unwrap();
    let t = be.host_copy(HostDir::ToDevice, 3).unwrap();
    println!("h2d {bytes} B: {:.1} GB/s", bytes as f64 / t[2] / 1e9);
    assert_eq!(be.host_verify(HostSide::Device, 5).unwrap(), Verified::default());
    be.host_fill(HostSide::Device, Some(9)).unwrap();
    be.host_fill(HostSide::Host, None).unwrap();
    let t = be.host_copy(HostDir::ToHost, 3).unwrap();
    println!("d2h {bytes} B: {:.1} GB/s", bytes as f64 / t[2] / 1e9);
    assert_eq!(be.host_verify(HostSide::Host, 9).unwrap(), Verified::default());
    assert_eq!(be.host_verify(HostSide::Host, 5).unwrap().wrong, bytes / 16);
    be.host_free();
}
