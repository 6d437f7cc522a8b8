//! Finding the CUDA libraries without panicking.
//!
//! cudarc (feature `dynamic-loading`) opens libcuda, libcublas and libnccl on first use and
//! panics when a library or one of its symbols is missing. Before cudarc touches a library we
//! open it ourselves with the same candidate names, in the same order (so we find the file
//! cudarc will find), and look up every symbol the backend's code path uses. Device
//! enumeration then runs under `catch_unwind` with the panic hook silenced, as a backstop.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use cudarc::driver::sys::CUdevice;
use cudarc::driver::{result as drv, DriverError};

/// One shared library cudarc loads at run time.
struct Lib {
    /// What to call it in messages.
    what: &'static str,
    /// The names cudarc expands into file names with `cudarc::get_lib_name_candidates`.
    stems: &'static [&'static str],
    /// Every symbol the backend reaches through cudarc (checked so a missing one is an error
    /// message, not a panic in the middle of a run).
    symbols: &'static [&'static str],
}

/// The driver API. Under cudarc's `cuda-13000` bindings the event timer is
/// `cuEventElapsedTime_v2`, which older drivers lack.
const DRIVER: Lib = Lib {
    what: "CUDA driver",
    stems: &["cuda", "nvcuda"],
    symbols: &[
        "cuInit",
        "cuDeviceGetCount",
        "cuDeviceGet",
        "cuDeviceGetName",
        "cuDeviceGetAttribute",
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuStreamCreate",
        "cuStreamSynchronize",
        "cuStreamDestroy_v2",
        "cuEventCreate",
        "cuEventRecord",
        "cuEventSynchronize",
        "cuEventElapsedTime_v2",
        "cuEventDestroy_v2",
        "cuMemAllocAsync",
        "cuMemFreeAsync",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemsetD8Async",
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuGetErrorString",
        "cuStreamWaitEvent",
        "cuEventQuery",
        "cuModuleLoadData",
        "cuModuleGetFunction",
        "cuLaunchKernel",
    ],
};

/// cuBLAS. It loads cuBLASLt itself (a `DT_NEEDED` dependency); we do not call cuBLASLt.
const CUBLAS: Lib = Lib {
    what: "cuBLAS",
    stems: &["cublas"],
    symbols: &["cublasCreate_v2", "cublasSetStream_v2", "cublasGemmEx", "cublasDestroy_v2"],
};

const NCCL: Lib = Lib {
    what: "NCCL",
    stems: &["nccl"],
    symbols: &[
        "ncclGetUniqueId",
        "ncclCommInitRank",
        "ncclAllReduce",
        "ncclAllGather",
        "ncclSend",
        "ncclRecv",
        "ncclGroupStart",
        "ncclGroupEnd",
        "ncclCommAbort",
        "ncclGetErrorString",
        "ncclGetLastError",
    ],
};

/// The file names cudarc tries for `lib`, in cudarc's order.
fn candidates(lib: &Lib) -> Vec<String> {
    lib.stems.iter().flat_map(|s| cudarc::get_lib_name_candidates(s)).collect()
}

/// Opens `lib` the way cudarc will and checks its symbols. The handle is kept open for the
/// life of the process (cudarc opens the same file next; this avoids an unload in between).
fn check(lib: &Lib) -> Result<(), String> {
    let names = candidates(lib);
    let mut odd_error = None;
    for name in &names {
        // SAFETY: these are the NVIDIA libraries cudarc itself would open by this very name;
        // running their initialisers is what any CUDA program does.
        match unsafe { libloading::Library::new(name) } {
            Ok(handle) => {
                for sym in lib.symbols {
                    // SAFETY: the symbol is only looked up, never called.
                    if unsafe { handle.get::<unsafe extern "C" fn()>(sym.as_bytes()) }.is_err() {
                        return Err(format!(
                            "{} library {name} lacks {sym}, which this build (cudarc's CUDA 13.0 \
                             bindings) calls: it is too old",
                            lib.what
                        ));
                    }
                }
                std::mem::forget(handle);
                return Ok(());
            }
            // "NAME: cannot open shared object file" just means absent; anything else (a
            // missing dependency, a wrong architecture) is worth showing.
            Err(e) => {
                let msg = e.to_string();
                if odd_error.is_none() && !msg.contains(&format!("{name}: cannot open shared object")) {
                    odd_error = Some(msg);
                }
            }
        }
    }
    let shown: Vec<&str> =
        names.iter().map(String::as_str).filter(|n| n.starts_with(&format!("lib{}.so", lib.stems[0]))).collect();
    let mut msg = format!(
        "{} library not found: none of {} (and {} other names) could be opened from \
         LD_LIBRARY_PATH or the ldconfig cache",
        lib.what,
        shown.join(", "),
        names.len() - shown.len()
    );
    if let Some(e) = odd_error {
        msg.push_str(&format!("; {e}"));
    }
    if lib.stems[0] == "nccl" {
        // SAFETY: as above, the NCCL library by its usual soname.
        if unsafe { libloading::Library::new("libnccl.so.2") }.is_ok() {
            msg.push_str(
                "; libnccl.so.2 is present but cudarc opens only the names above: put a \
                 libnccl.so symlink to it in a directory on LD_LIBRARY_PATH",
            );
        }
    }
    Err(msg)
}

/// Checks that cuBLAS and NCCL (and the driver) can be loaded and have every symbol the
/// backend uses, naming the first missing one. Never panics.
pub fn check_libraries() -> Result<(), String> {
    check(&DRIVER)?;
    check(&CUBLAS)?;
    check(&NCCL)
}

/// Names of the usable CUDA devices, or a one-line reason why there are none. Never panics
/// and prints nothing.
pub fn probe() -> Result<Vec<String>, String> {
    check(&DRIVER)?;
    catch_silently(|| {
        drv::init().map_err(|e| format!("CUDA driver initialisation failed: {}", driver_error(&e)))?;
        let count = drv::device::get_count().map_err(|e| format!("cuDeviceGetCount: {}", driver_error(&e)))?;
        if count <= 0 {
            return Err("the CUDA driver reports no devices".to_string());
        }
        (0..count)
            .map(|i| {
                drv::device::get(i)
                    .and_then(drv::device::get_name)
                    .map_err(|e| format!("CUDA device {i}: {}", driver_error(&e)))
            })
            .collect()
    })?
}

/// The PCI address (`0000:3b:00.0`) of each usable CUDA device, in the order of [`probe`]: the
/// job's GPUs as the host's kernel log and sysfs name them. Never panics and prints nothing.
pub fn probe_pci_bus_ids() -> Result<Vec<String>, String> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    each_device(|dev| {
        // SAFETY: `dev` is a device handle the initialised driver just returned;
        // cuDeviceGetAttribute only reads that device's attribute.
        let attr = |a: A| unsafe { drv::device::get_attribute(dev, a) };
        let (domain, bus, device) = (
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        );
        Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
    })
}

/// Total memory of each usable CUDA device, in bytes (in the order of [`probe`]). Never
/// panics and prints nothing.
pub fn probe_memory() -> Result<Vec<u64>, String> {
    // SAFETY: `dev` is a device handle the initialised driver just returned; cuDeviceTotalMem
    // only reads that device's attribute.
    each_device(|dev| unsafe { drv::device::total_mem(dev) }.map(|b| b as u64))
}

/// `read` of every usable CUDA device, in the driver's order, after initialising the driver;
/// an error names the device. Never panics and prints nothing.
fn each_device<T>(read: impl Fn(CUdevice) -> Result<T, DriverError>) -> Result<Vec<T>, String> {
    check(&DRIVER)?;
    catch_silently(|| {
        drv::init().map_err(|e| format!("CUDA driver initialisation failed: {}", driver_error(&e)))?;
        let count = drv::device::get_count().map_err(|e| format!("cuDeviceGetCount: {}", driver_error(&e)))?;
        (0..count)
            .map(|i| drv::device::get(i).and_then(&read).map_err(|e| format!("CUDA device {i}: {}", driver_error(&e))))
            .collect()
    })?
}

/// `DriverError` as `CUDA_ERROR_X (description)`.
pub fn driver_error(e: &DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{:?} ({})", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

/// Runs `f`, turning a panic into `Err` with its message, with the panic hook silenced so
/// nothing is printed. The hook is process-wide: meant for start-up probing, not hot paths.
pub(crate) fn catch_silently<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    let hook = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    panic::set_hook(hook);
    r.map_err(|p| panic_message(p.as_ref()))
}

/// The first line of a panic payload.
pub fn panic_message(p: &(dyn Any + Send)) -> String {
    let s = if let Some(s) = p.downcast_ref::<&str>() {
        s
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.as_str()
    } else {
        "unknown panic"
    };
    s.lines().next().unwrap_or_default().to_string()
}

/// Whether the driver library can be opened (tests use it to tell "no CUDA here" apart).
pub fn driver_present() -> bool {
    check(&DRIVER).is_ok()
}
