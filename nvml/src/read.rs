//! A reading through `nvml-wrapper` as a [`Read`]: the value, not supported by the device or
//! the driver, or the error; what the monitor and the readiness readings share.

use nvml_wrapper::error::NvmlError as WrapperError;

use gpusanity_common::health::Read;

pub(crate) fn read<T>(r: Result<T, WrapperError>) -> Read<T> {
    match r {
        Ok(v) => Read::Value(v),
        Err(WrapperError::NotSupported | WrapperError::FailedToLoadSymbol(_) | WrapperError::FunctionNotFound) => {
            Read::NotSupported
        }
        Err(e) => Read::Error(e.to_string()),
    }
}
