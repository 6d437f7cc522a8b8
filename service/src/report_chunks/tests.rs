use super::*;

fn example() -> Report {
    serde_json::from_str(include_str!("../../../docs/examples/report-cpu.json")).expect("example report")
}

/// The example with a note of `n` bytes that gzip cannot shrink much (hex of a hash chain).
fn large(n: usize) -> Report {
    let mut r = example();
    let mut s = String::with_capacity(n + 64);
    let mut h = Sha256::digest(b"seed");
    while s.len() < n {
        h = Sha256::digest(h);
        s.push_str(&hex::encode(h));
    }
    r.checks[0].ranks[0].notes.insert("filler".into(), s);
    r
}

fn join(chunks: &[ReportChunk]) -> Joiner {
    let mut j = Joiner::default();
    for c in chunks {
        let _ = j.push(c);
    }
    j
}

#[test]
fn a_report_past_the_message_limit_joins_whole() {
    let r = large(9_000_000);
    let (chunks, meta) = split(&r, "run-1", 0).expect("split");
    assert!(chunks.len() > 1, "{} chunks", chunks.len());
    assert_eq!(meta.chunks as usize, chunks.len());
    for c in &chunks {
        assert!(c.data.len() < 1 << 20, "chunk {} is {} bytes", c.seq, c.data.len());
    }
    assert_eq!(join(&chunks).finish(&meta), Ok(r));
}

#[test]
fn a_gap_or_a_missing_tail_is_named_and_no_report_comes() {
    let (chunks, meta) = split(&large(2_000_000), "run-1", 0).expect("split");
    assert!(chunks.len() >= 3);
    let mut j = Joiner::default();
    assert_eq!(j.push(&chunks[0]), Ok(()));
    assert_eq!(j.push(&chunks[2]), Err(ChunkError::OutOfOrder { want: 1, got: 2 }));
    // The stream stays broken: the chunk that was due no longer mends it.
    assert!(matches!(j.push(&chunks[1]), Err(ChunkError::Broken(_))));
    assert!(matches!(j.finish(&meta), Err(ChunkError::Broken(e)) if *e == ChunkError::OutOfOrder { want: 1, got: 2 }));

    let n = chunks.len() as u32;
    assert_eq!(join(&chunks[..chunks.len() - 1]).finish(&meta), Err(ChunkError::Missing { want: n, got: n - 1 }));
}

#[test]
fn chunks_read_again_are_ignored_or_start_the_stream_again() {
    let r = large(2_000_000);
    let (chunks, meta) = split(&r, "run-1", 0).expect("split");
    let mut again = vec![chunks[0].clone(), chunks[1].clone(), chunks[0].clone()];
    again.extend(chunks.iter().skip(1).cloned());
    again.insert(3, chunks[1].clone());
    assert_eq!(join(&again).finish(&meta), Ok(r));
}

#[test]
fn a_forged_stream_is_refused() {
    let (mut chunks, meta) = split(&large(1_500_000), "run-1", 0).expect("split");
    // Another report's chunks under this one's announcement: the digest differs.
    let (other, other_meta) = split(&large(1_400_000), "run-1", 0).expect("split");
    assert_eq!(
        join(&other).finish(&ChunkedReport { sha256: meta.sha256.clone(), ..other_meta.clone() }),
        Err(ChunkError::Digest)
    );
    assert!(matches!(join(&other).finish(&meta), Err(ChunkError::Missing { .. } | ChunkError::Length { .. })));
    // A byte changed in a chunk.
    let mut bytes = base64::engine::general_purpose::STANDARD.decode(&chunks[1].data).expect("b64");
    bytes[10] ^= 1;
    chunks[1].data = base64::engine::general_purpose::STANDARD.encode(&bytes);
    assert_eq!(join(&chunks).finish(&meta), Err(ChunkError::Digest));
    // Not base64.
    let mut j = Joiner::default();
    let bad = ReportChunk { run_id: "run-1".into(), node_rank: 0, seq: 0, data: "not base64!".into() };
    assert_eq!(j.push(&bad), Err(ChunkError::NotBase64));
    // A digest that matches bytes that are no gzip: unreadable, not a panic.
    let junk = b"no gzip here".to_vec();
    let c = ReportChunk { seq: 0, data: base64::engine::general_purpose::STANDARD.encode(&junk), ..bad };
    let meta = ChunkedReport { chunks: 1, gzip_bytes: junk.len() as u64, sha256: hex::encode(Sha256::digest(&junk)) };
    assert!(matches!(join(&[c]).finish(&meta), Err(ChunkError::Unreadable(_))));
}

#[test]
fn oversized_streams_are_refused_before_they_are_held() {
    // One chunk whose text alone would pass the bound: refused before decoding.
    let huge = ReportChunk {
        run_id: "r".into(),
        node_rank: 0,
        seq: 0,
        data: "A".repeat((MAX_GZIP_BYTES as usize / 3 + 2) * 4),
    };
    let mut j = Joiner::default();
    assert_eq!(j.push(&huge), Err(ChunkError::TooLarge));
    assert!(j.stream.is_empty());
    // Many small chunks: refused past the count.
    let mut j = Joiner::default();
    let small = |seq| ReportChunk { run_id: "r".into(), node_rank: 0, seq, data: "AAAA".into() };
    for seq in 0..MAX_CHUNKS {
        assert_eq!(j.push(&small(seq)), Ok(()));
    }
    assert_eq!(j.push(&small(MAX_CHUNKS)), Err(ChunkError::TooMany));
    // An announcement of more chunks than allowed.
    let meta = ChunkedReport { chunks: u32::MAX, gzip_bytes: u64::MAX, sha256: String::new() };
    assert_eq!(Joiner::default().finish(&meta), Err(ChunkError::TooMany));
}

#[test]
fn a_gzip_bomb_is_cut_at_the_bound() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let zeros = vec![b' '; 1 << 20];
    for _ in 0..=(MAX_REPORT_BYTES >> 20) {
        std::io::Write::write_all(&mut gz, &zeros).expect("gzip");
    }
    let stream = gz.finish().expect("gzip");
    assert!((stream.len() as u64) < MAX_GZIP_BYTES, "{}", stream.len());
    let chunks: Vec<ReportChunk> = stream
        .chunks(CHUNK_BYTES)
        .zip(0u32..)
        .map(|(p, seq)| ReportChunk {
            run_id: "r".into(),
            node_rank: 0,
            seq,
            data: base64::engine::general_purpose::STANDARD.encode(p),
        })
        .collect();
    let meta = ChunkedReport {
        chunks: chunks.len() as u32,
        gzip_bytes: stream.len() as u64,
        sha256: hex::encode(Sha256::digest(&stream)),
    };
    assert_eq!(join(&chunks).finish(&meta), Err(ChunkError::Inflated));
}
