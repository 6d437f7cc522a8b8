//! A GPU's XID event set: opened once, drained without waiting. Shared by the health check's
//! [`crate::Monitor`] and the watch's [`crate::watch::WatchedGpu`].

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::{Device, EventSet, Nvml};

/// An event set of `device`'s critical XIDs.
pub(crate) fn open(nvml: &'static Nvml, device: &Device<'static>) -> Result<EventSet<'static>, WrapperError> {
    let set = nvml.create_event_set()?;
    // A failed registration hands the set back with its error: the error is what counts.
    device.register_events(EventTypes::CRITICAL_XID_ERROR, set).map_err(|e| e.error)
}

/// Takes the XIDs raised so far, until `out` holds `max`; an XID NVML could not name is 0,
/// never in the fatal table.
pub(crate) fn drain(set: &EventSet<'static>, out: &mut Vec<u64>, max: usize) -> Result<(), WrapperError> {
    while out.len() < max {
        match set.wait(0) {
            Ok(ev) => out.push(match ev.event_data {
                Some(XidError::Value(x)) => x,
                Some(XidError::Unknown) | None => 0,
            }),
            Err(WrapperError::Timeout) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
