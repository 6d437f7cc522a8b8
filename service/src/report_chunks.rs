//! Node 0's report when it is too large for one Kafka message: the agent gzips report.json
//! and cuts the stream into [`ReportChunk`]s sent in order ahead of its `Result`, which names
//! their count, length and SHA-256 ([`ChunkedReport`]); the coordinator joins them
//! ([`Joiner`]) and reads the report. Every chunk is a signed agent report like any other
//! (the envelope, the key that may speak for the node, the agent holding node 0 of the run),
//! so only node 0's agent can feed a run's stream. What one run's stream may hold is bounded
//! ([`MAX_GZIP_BYTES`], [`MAX_CHUNKS`]), and so is what it may inflate to
//! ([`MAX_REPORT_BYTES`]): a forged length or a gzip bomb is refused, not allocated.

use std::io::Read;

use base64::Engine as _;
use gpusanity_common::report::Report;
use gpusanity_common::wire::agent::{ChunkedReport, ReportChunk};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// A report's JSON up to this length travels inside its `Result`.
pub const INLINE_MAX: usize = 512 * 1024;
/// Gzip bytes per chunk: 700 KB of base64 in a message, under the 1 MiB a broker takes by
/// default.
pub const CHUNK_BYTES: usize = 512 * 1024;
/// The most a run's joined gzip stream may hold.
pub const MAX_GZIP_BYTES: u64 = 64 << 20;
/// The most chunks a report may come in (a stream of smaller chunks is refused past it).
pub const MAX_CHUNKS: u32 = 1024;
/// The most a report may inflate to.
pub const MAX_REPORT_BYTES: u64 = 512 << 20;

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ChunkError {
    #[error("chunk {got} came where chunk {want} was due")]
    OutOfOrder { want: u32, got: u32 },
    #[error("a chunk is not base64")]
    NotBase64,
    #[error("the chunks hold more than {MAX_GZIP_BYTES} bytes")]
    TooLarge,
    #[error("more than {MAX_CHUNKS} chunks")]
    TooMany,
    #[error("{got} chunks joined, {want} announced")]
    Missing { want: u32, got: u32 },
    #[error("the joined stream is {got} bytes, {want} announced")]
    Length { want: u64, got: u64 },
    #[error("the joined stream's SHA-256 differs from the one announced")]
    Digest,
    #[error("the report inflates past {MAX_REPORT_BYTES} bytes")]
    Inflated,
    #[error("the report does not read: {0}")]
    Unreadable(String),
    #[error("an earlier chunk was refused: {0}")]
    Broken(Box<ChunkError>),
}

/// The chunks of `report` and what its `Result` says of them.
pub fn split(report: &Report, run_id: &str, node_rank: usize) -> std::io::Result<(Vec<ReportChunk>, ChunkedReport)> {
    let json = serde_json::to_vec(report)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &json)?;
    let stream = gz.finish()?;
    let chunks: Vec<ReportChunk> = stream
        .chunks(CHUNK_BYTES)
        .zip(0u32..)
        .map(|(piece, seq)| ReportChunk {
            run_id: run_id.to_string(),
            node_rank,
            seq,
            data: base64::engine::general_purpose::STANDARD.encode(piece),
        })
        .collect();
    let meta = ChunkedReport {
        chunks: u32::try_from(chunks.len()).map_err(std::io::Error::other)?,
        gzip_bytes: stream.len() as u64,
        sha256: hex::encode(Sha256::digest(&stream)),
    };
    Ok((chunks, meta))
}

/// One run's chunks as they arrive.
#[derive(Debug, Default)]
pub struct Joiner {
    next: u32,
    stream: Vec<u8>,
    broken: Option<ChunkError>,
}

impl Joiner {
    /// Takes the next chunk. A chunk 0 starts the stream again (the same chunks read again
    /// after a consumer rebalance); a repeated earlier chunk is ignored; a gap, an undecodable
    /// chunk or one past the bounds breaks the stream, which the `Result` then reports.
    pub fn push(&mut self, c: &ReportChunk) -> Result<(), ChunkError> {
        if c.seq == 0 {
            *self = Joiner::default();
        } else if c.seq < self.next {
            return Ok(());
        }
        if let Some(e) = &self.broken {
            return Err(ChunkError::Broken(Box::new(e.clone())));
        }
        let r = self.take(c);
        if let Err(e) = &r {
            self.broken = Some(e.clone());
            self.stream = Vec::new();
        }
        r
    }

    fn take(&mut self, c: &ReportChunk) -> Result<(), ChunkError> {
        if c.seq != self.next {
            return Err(ChunkError::OutOfOrder { want: self.next, got: c.seq });
        }
        if c.seq >= MAX_CHUNKS {
            return Err(ChunkError::TooMany);
        }
        // Base64 is 4 bytes for 3: refuse an oversized chunk before decoding it.
        let room = MAX_GZIP_BYTES.saturating_sub(self.stream.len() as u64);
        if (c.data.len() as u64 / 4).saturating_mul(3) > room {
            return Err(ChunkError::TooLarge);
        }
        let bytes = base64::engine::general_purpose::STANDARD.decode(&c.data).map_err(|_| ChunkError::NotBase64)?;
        let total = (self.stream.len() as u64).checked_add(bytes.len() as u64).ok_or(ChunkError::TooLarge)?;
        if total > MAX_GZIP_BYTES {
            return Err(ChunkError::TooLarge);
        }
        self.stream.extend_from_slice(&bytes);
        self.next += 1;
        Ok(())
    }

    /// The report, if the chunks joined are the ones `meta` announced.
    pub fn finish(self, meta: &ChunkedReport) -> Result<Report, ChunkError> {
        if let Some(e) = self.broken {
            return Err(ChunkError::Broken(Box::new(e)));
        }
        if meta.chunks > MAX_CHUNKS {
            return Err(ChunkError::TooMany);
        }
        if self.next != meta.chunks {
            return Err(ChunkError::Missing { want: meta.chunks, got: self.next });
        }
        if self.stream.len() as u64 != meta.gzip_bytes {
            return Err(ChunkError::Length { want: meta.gzip_bytes, got: self.stream.len() as u64 });
        }
        let digest = hex::encode(Sha256::digest(&self.stream));
        if !bool::from(subtle::ConstantTimeEq::ct_eq(digest.as_bytes(), meta.sha256.to_ascii_lowercase().as_bytes())) {
            return Err(ChunkError::Digest);
        }
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(self.stream.as_slice())
            .take(MAX_REPORT_BYTES + 1)
            .read_to_end(&mut json)
            .map_err(|e| ChunkError::Unreadable(e.to_string()))?;
        if json.len() as u64 > MAX_REPORT_BYTES {
            return Err(ChunkError::Inflated);
        }
        serde_json::from_slice(&json).map_err(|e| ChunkError::Unreadable(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
