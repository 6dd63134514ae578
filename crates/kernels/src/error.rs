//! The one error type of the crate.
//!
//! Only constructors and validators fail with [`Error`]: a malformed buffer
//! must be reported to the caller (it usually comes from a file written by
//! someone else), whereas the hot paths (`matvec`, `dot`, ...) `assert!` their
//! length invariants because a mismatch there is a bug in the caller.

/// Everything that can go wrong when building kernel inputs.
///
/// Variants carry enough context (format, shape, expected vs actual lengths)
/// that the message alone identifies the faulty tensor's shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A buffer has the wrong length for the matrix shape it claims.
    #[error("{format} {what} for a [{rows}, {cols}] matrix: expected {expected} {unit}, got {actual}")]
    Length {
        /// Quant format name (`"f32"`, `"q4"`, ...).
        format: &'static str,
        /// Which buffer: `"weights"` or `"scales"`.
        what: &'static str,
        /// Unit of the two lengths: `"elements"` or `"bytes"`.
        unit: &'static str,
        rows: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    /// A byte buffer cannot be reinterpreted in place because its start is
    /// not aligned for the element type.
    #[error("{format} {what}: byte buffer at {addr:#x} is not aligned to {align} bytes")]
    Misaligned { format: &'static str, what: &'static str, addr: usize, align: usize },
    /// `rows * cols` (or its byte size) does not fit in `usize`.
    #[error("{format}: a [{rows}, {cols}] matrix is too large to address")]
    ShapeOverflow { format: &'static str, rows: usize, cols: usize },
    /// Grouped formats need at least one column per group.
    #[error("{format}: group size must be at least 1 column, got {group}")]
    InvalidGroup { format: &'static str, group: usize },
    /// MXFP4 rows are whole blocks of 32 columns.
    #[error("mxfp4: a row of {cols} columns is not whole blocks of 32")]
    PartialMxfp4Block { cols: usize },
    /// An on-disk format ordinal this version does not know.
    #[error("unknown quant format ordinal {ordinal} (known: 0=f32, 1=bf16, 2=q8, 3=q4, 4=mxfp4)")]
    UnknownFormatOrdinal { ordinal: u8 },
    /// A format name this version does not know.
    #[error("unknown quant format name {name:?} (known: f32, bf16, q8, q4, mxfp4)")]
    UnknownFormatName { name: String },
    /// A row range that does not lie inside the matrix.
    #[error("rows {start}..{start}+{count} out of range for a matrix with {rows} rows")]
    RowRange { start: usize, count: usize, rows: usize },
    /// A thread pool needs at least one thread.
    #[error("thread count must be at least 1, got 0")]
    ZeroThreads,
    /// The OS refused to create the pool's threads.
    #[error("building a pool of {n_threads} threads failed: {reason}")]
    ThreadPool { n_threads: usize, reason: String },
    /// This build has no CUDA support.
    #[error("this build has no CUDA support: build with `--features cuda`")]
    CudaNotBuilt,
    /// The NVIDIA driver's library could not be loaded.
    #[error("no CUDA driver: {library} was not found (install the NVIDIA driver, or run with --device gpu or cpu)")]
    NoCudaDriver { library: &'static str },
    /// The driver refused the device.
    #[error("CUDA: {reason}")]
    Cuda { reason: String },
    /// No NVRTC library loaded: the CUDA kernels are compiled when the
    /// device opens.
    #[error(
        "no NVRTC, the CUDA run-time compiler that builds Strata's kernels when the device opens (tried {tried}): \
         install CUDA 12 or 13's NVRTC (pip's nvidia-cuda-nvrtc wheel has one), or name the library in \
         STRATA_NVRTC_LIBRARY"
    )]
    NoNvrtc { tried: String },
    /// NVRTC refused a kernel source: a bug of ours, its log says where.
    #[error("NVRTC could not compile {name}:\n{log}")]
    NvrtcCompile { name: String, log: String },
    /// This build has no GPU support.
    #[error("this build has no GPU support: build with `--features gpu`")]
    GpuNotBuilt,
    /// No GPU adapter could be had.
    #[error("no GPU: {reason}")]
    NoGpuAdapter { reason: String },
    /// A matrix the GPU kernels do not take; it stays on the CPU.
    #[error(
        "a {format} matrix{} has no GPU kernel (q8 and q4 with power-of-two groups of whole lanes have one)",
        .group.map(|g| format!(" with groups of {g} columns")).unwrap_or_default()
    )]
    GpuUnsupported { format: &'static str, group: Option<usize> },
    /// The GPU refused a device or a buffer.
    #[error("GPU: {reason}")]
    Gpu { reason: String },
    /// The GPU had no memory left for a buffer (wgpu's out-of-memory error
    /// scope): the matrix stays on the host.
    #[error("GPU out of memory for {what}: {bytes} bytes")]
    GpuOutOfMemory { what: &'static str, bytes: u64 },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
