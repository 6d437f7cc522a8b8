//! `--device`, as the commands that run checks take it (the wrapper and the agent).

use gpusanity_common::device::DeviceChoice;

/// `--device`: one of [`DeviceChoice::NAMES`], listed in the help and in the error.
pub fn device_parser() -> impl clap::builder::TypedValueParser<Value = DeviceChoice> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(DeviceChoice::NAMES).try_map(|s| s.parse::<DeviceChoice>())
}
