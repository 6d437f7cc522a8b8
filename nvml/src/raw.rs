//! The readings `nvml-wrapper` has no safe call for (row remapping, a P-state's clock range),
//! through its raw bindings.

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{
    nvmlClockType_enum_NVML_CLOCK_SM, nvmlGpuFabricInfo_t, nvmlPStates_enum_NVML_PSTATE_0,
    nvmlRowRemapperHistogramValues_t, NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    NVML_GPU_FABRIC_STATE_NOT_STARTED, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
};

use gpusanity_common::health::readiness::Fabric;
use gpusanity_common::health::{BankHistogram, RemappedRows};

/// `nvmlDeviceGetRemappedRows`.
pub fn remapped_rows(nvml: &nvml_wrapper::Nvml, device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let sym =
        nvml.lib().nvmlDeviceGetRemappedRows.as_ref().map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: `sym` is NVML's own nvmlDeviceGetRemappedRows, looked up by its name in the
    // initialised library; `device.handle()` is a live handle of that library (the device
    // borrows the Nvml it came from); the four out-pointers are to local u32s, the
    // `unsigned int *` the function takes, valid for the call.
    let ret = unsafe { sym(device.handle(), &mut corr, &mut unc, &mut pending, &mut failure) };
    nvml_try(ret)?;
    Ok(RemappedRows { correctable: corr, uncorrectable: unc, pending: pending != 0, failure: failure != 0 })
}

/// `nvmlDeviceGetMinMaxClockOfPState` of the SM clock in P0: (lowest, highest) MHz. Its highest
/// below the device's maximum SM clock means the clocks are locked.
pub fn p0_sm_clock_range(nvml: &nvml_wrapper::Nvml, device: &Device<'_>) -> Result<(u32, u32), NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetMinMaxClockOfPState
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut min, mut max) = (0u32, 0u32);
    // SAFETY: as above; the clock type and P-state are the enums' own constants, the two
    // out-pointers are to local u32s (`unsigned int *`), valid for the call.
    let ret = unsafe {
        sym(device.handle(), nvmlClockType_enum_NVML_CLOCK_SM, nvmlPStates_enum_NVML_PSTATE_0, &mut min, &mut max)
    };
    nvml_try(ret)?;
    Ok((min, max))
}

/// `nvmlDeviceGetRowRemapperHistogram`.
pub fn bank_histogram(nvml: &nvml_wrapper::Nvml, device: &Device<'_>) -> Result<BankHistogram, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetRowRemapperHistogram
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut v = nvmlRowRemapperHistogramValues_t { max: 0, high: 0, partial: 0, low: 0, none: 0 };
    // SAFETY: as above; `v` is the `nvmlRowRemapperHistogramValues_t` the function fills, of
    // the layout bindgen generated from NVML's header, valid for the call.
    let ret = unsafe { sym(device.handle(), &mut v) };
    nvml_try(ret)?;
    Ok(BankHistogram { max: v.max, high: v.high, partial: v.partial, low: v.low, none: v.none })
}

/// `nvmlDeviceGetGpuFabricInfo`: the GPU's NVSwitch fabric state and status (`not_supported`
/// for a GPU with no fabric; `Ok(None)` for a state this code does not know).
pub fn fabric(nvml: &nvml_wrapper::Nvml, device: &Device<'_>) -> Result<Option<Fabric>, NvmlError> {
    let sym =
        nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref().map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut info = nvmlGpuFabricInfo_t { clusterUuid: [0; 16], status: 0, cliqueId: 0, state: 0 };
    // SAFETY: as above; `info` is the `nvmlGpuFabricInfo_t` the function fills, of the layout
    // bindgen generated from NVML's header, valid for the call.
    let ret = unsafe { sym(device.handle(), &mut info) };
    nvml_try(ret)?;
    let state = match u32::from(info.state) {
        NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => "not_supported",
        NVML_GPU_FABRIC_STATE_NOT_STARTED => "not_started",
        NVML_GPU_FABRIC_STATE_IN_PROGRESS => "in_progress",
        NVML_GPU_FABRIC_STATE_COMPLETED => "completed",
        _ => return Ok(None),
    };
    Ok(Some(Fabric { state: state.into(), status: info.status }))
}
