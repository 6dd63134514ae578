//! NVRTC, CUDA's run-time compiler, which builds `products.cu` to PTX when
//! a device opens: loaded at run time like the driver, so that building
//! Strata needs no CUDA toolkit.
//!
//! cudarc's own loader, built against CUDA 12.4's API, only ever looks for
//! `libnvrtc.so`, `libnvrtc.so.12` and older names, and holds the one it
//! found for the process; this one (libloading, as cudarc's) also takes
//! CUDA 13's (`libnvrtc.so.13`, which pip's `nvidia-cuda-nvrtc` wheel
//! ships), the library [`LIBRARY_VAR`] names first, and in tests the
//! fixtures venv's. The few functions used (create, compile, log, PTX,
//! version, supported architectures) have one signature in NVRTC 12 and 13:
//! cudarc's `nvrtc::sys` declares their types.

use std::ffi::{CString, c_char, c_int};
use std::path::PathBuf;

use cudarc::nvrtc::sys::{nvrtcProgram, nvrtcResult};
use libloading::Library;

use crate::error::{Error, Result};

/// The environment variable naming the NVRTC library to load before any
/// other (a path, or a name the dynamic loader finds).
pub const LIBRARY_VAR: &str = "STRATA_NVRTC_LIBRARY";

/// Names the dynamic loader is asked for, newest CUDA first, after
/// [`LIBRARY_VAR`].
const LIBRARY_NAMES: &[&str] = if cfg!(windows) {
    &["nvrtc64_130_0.dll", "nvrtc64_120_0.dll"]
} else {
    &["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
};

/// NVRTC's functions, as its header declares them.
#[derive(Clone, Copy)]
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> nvrtcResult,
    num_supported_archs: unsafe extern "C" fn(*mut c_int) -> nvrtcResult,
    supported_archs: unsafe extern "C" fn(*mut c_int) -> nvrtcResult,
    create_program: unsafe extern "C" fn(
        *mut nvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> nvrtcResult,
    compile_program: unsafe extern "C" fn(nvrtcProgram, c_int, *const *const c_char) -> nvrtcResult,
    destroy_program: unsafe extern "C" fn(*mut nvrtcProgram) -> nvrtcResult,
    program_log_size: unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult,
    program_log: unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult,
    ptx_size: unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult,
    ptx: unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult,
}

impl Api {
    /// The functions of `library`, or the first one missing.
    ///
    /// # Safety
    /// `library` must be NVRTC, whose functions have these signatures; the
    /// pointers are valid while it stays loaded.
    unsafe fn of(library: &Library) -> std::result::Result<Self, libloading::Error> {
        // SAFETY: the caller's: each symbol is NVRTC's function of this type.
        unsafe {
            Ok(Self {
                version: *library.get(b"nvrtcVersion\0")?,
                num_supported_archs: *library.get(b"nvrtcGetNumSupportedArchs\0")?,
                supported_archs: *library.get(b"nvrtcGetSupportedArchs\0")?,
                create_program: *library.get(b"nvrtcCreateProgram\0")?,
                compile_program: *library.get(b"nvrtcCompileProgram\0")?,
                destroy_program: *library.get(b"nvrtcDestroyProgram\0")?,
                program_log_size: *library.get(b"nvrtcGetProgramLogSize\0")?,
                program_log: *library.get(b"nvrtcGetProgramLog\0")?,
                ptx_size: *library.get(b"nvrtcGetPTXSize\0")?,
                ptx: *library.get(b"nvrtcGetPTX\0")?,
            })
        }
    }
}

/// A loaded NVRTC library.
pub(crate) struct Nvrtc {
    api: Api,
    /// Keeps `api`'s functions loaded.
    _library: Library,
    /// Where it was found, as an error names it.
    found: String,
    /// NVRTC's (major, minor) version.
    version: (i32, i32),
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc").field("found", &self.found).field("version", &self.version).finish_non_exhaustive()
    }
}

impl Nvrtc {
    /// The library [`LIBRARY_VAR`] names, else the first of
    /// [`LIBRARY_NAMES`] the dynamic loader finds, else the first of
    /// `extra` that loads; or which were tried.
    pub(crate) fn find(extra: &[PathBuf]) -> Result<Self> {
        let named = std::env::var_os(LIBRARY_VAR).map(PathBuf::from);
        let candidates = named.into_iter().chain(LIBRARY_NAMES.iter().map(PathBuf::from)).chain(extra.iter().cloned());
        let mut tried = Vec::new();
        for candidate in candidates {
            // SAFETY: loading NVRTC runs its initializers, as any use of it
            // does, and a library that lacks its functions is refused.
            let loaded = unsafe { Library::new(&candidate) }.and_then(|library| {
                // SAFETY: the library was asked for by NVRTC's names.
                unsafe { Api::of(&library) }.map(|api| (library, api))
            });
            match loaded {
                Ok((library, api)) => {
                    let (mut major, mut minor): (c_int, c_int) = (0, 0);
                    // SAFETY: two valid out-pointers.
                    check("nvrtcVersion", unsafe { (api.version)(&mut major, &mut minor) })?;
                    let found = candidate.display().to_string();
                    return Ok(Self { api, _library: library, found, version: (major, minor) });
                }
                Err(_) => tried.push(candidate.display().to_string()),
            }
        }
        Err(Error::NoNvrtc { tried: tried.join(", ") })
    }

    /// NVRTC's (major, minor) version.
    pub(crate) fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Where the library was found.
    pub(crate) fn found(&self) -> &str {
        &self.found
    }

    /// The compute capabilities (`major * 10 + minor`) this NVRTC compiles
    /// for, ascending.
    pub(crate) fn supported_archs(&self) -> Result<Vec<u32>> {
        let mut count: c_int = 0;
        // SAFETY: a valid out-pointer.
        check("nvrtcGetNumSupportedArchs", unsafe { (self.api.num_supported_archs)(&mut count) })?;
        let mut archs = vec![0 as c_int; usize::try_from(count).unwrap_or(0)];
        // SAFETY: room for the `count` architectures NVRTC just said it has.
        check("nvrtcGetSupportedArchs", unsafe { (self.api.supported_archs)(archs.as_mut_ptr()) })?;
        let mut archs: Vec<u32> = archs.into_iter().filter_map(|a| u32::try_from(a).ok()).collect();
        archs.sort_unstable();
        Ok(archs)
    }

    /// The highest architecture this NVRTC compiles for that a device of
    /// compute capability `device_arch` runs (PTX of an older virtual
    /// architecture runs on newer devices), or why there is none.
    pub(crate) fn arch_for(&self, device_arch: u32) -> Result<u32> {
        let archs = self.supported_archs()?;
        archs.iter().copied().filter(|&a| a <= device_arch).max().ok_or_else(|| Error::Cuda {
            reason: format!(
                "NVRTC {}.{} ({}) compiles for compute capabilities {archs:?}, none at most the device's {device_arch}",
                self.version.0, self.version.1, self.found
            ),
        })
    }

    /// `source` compiled to PTX for the virtual architecture `compute_{arch}`,
    /// exactly as written: no contraction of multiplies and adds into fused
    /// ones (`--fmad=false`), subnormals kept (`--ftz=false`), correctly
    /// rounded division and square root; or NVRTC's log of why not.
    pub(crate) fn compile_ptx(&self, source: &str, name: &str, arch: u32) -> Result<String> {
        let source =
            CString::new(source).map_err(|_| Error::Cuda { reason: format!("{name}: a NUL in the source") })?;
        let file = CString::new(name).map_err(|_| Error::Cuda { reason: format!("{name}: a NUL in the name") })?;
        let mut program: nvrtcProgram = std::ptr::null_mut();
        // SAFETY: valid C strings, no headers.
        check("nvrtcCreateProgram", unsafe {
            (self.api.create_program)(
                &mut program,
                source.as_ptr(),
                file.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        })?;
        let program = Program { api: self.api, program };
        let options: Vec<CString> = [
            format!("--gpu-architecture=compute_{arch}"),
            "--fmad=false".into(),
            "--ftz=false".into(),
            "--prec-div=true".into(),
            "--prec-sqrt=true".into(),
        ]
        .into_iter()
        .map(|option| CString::new(option).expect("options have no NUL"))
        .collect();
        let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let count = c_int::try_from(pointers.len()).expect("a handful of options");
        // SAFETY: a live program and `count` valid C strings.
        let compiled = unsafe { (self.api.compile_program)(program.program, count, pointers.as_ptr()) };
        if compiled != nvrtcResult::NVRTC_SUCCESS {
            let log = program.log().unwrap_or_else(|e| e.to_string());
            return Err(Error::NvrtcCompile { name: name.to_owned(), log });
        }
        program.ptx()
    }
}

/// An NVRTC program, destroyed when dropped (before its [`Nvrtc`]).
struct Program {
    api: Api,
    program: nvrtcProgram,
}

impl Program {
    /// NVRTC's bytes of `what`, whose size `size` gives, as text.
    fn text(
        &self,
        what: &'static str,
        size: unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult,
        get: unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult,
    ) -> Result<String> {
        let mut bytes = 0usize;
        // SAFETY: a live program and a valid out-pointer.
        check(what, unsafe { size(self.program, &mut bytes) })?;
        let mut text = vec![0u8; bytes.max(1)];
        // SAFETY: room for the `bytes` NVRTC just said it writes.
        check(what, unsafe { get(self.program, text.as_mut_ptr().cast()) })?;
        let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
        text.truncate(end);
        String::from_utf8(text).map_err(|_| Error::Cuda { reason: format!("{what}: not UTF-8") })
    }

    fn log(&self) -> Result<String> {
        self.text("nvrtcGetProgramLog", self.api.program_log_size, self.api.program_log)
    }

    fn ptx(&self) -> Result<String> {
        self.text("nvrtcGetPTX", self.api.ptx_size, self.api.ptx)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created and is destroyed once, here.
        let destroyed = unsafe { (self.api.destroy_program)(&mut self.program) };
        debug_assert_eq!(destroyed, nvrtcResult::NVRTC_SUCCESS, "nvrtcDestroyProgram");
    }
}

/// `result` as this crate's error, naming the call.
fn check(call: &'static str, result: nvrtcResult) -> Result<()> {
    if result == nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda { reason: format!("{call}: {result:?}") })
    }
}
