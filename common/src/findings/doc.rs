//! What documents a finding code (its row of docs/findings.md: [`CodeDoc`], with what raises
//! it, [`Raised`]) and `finding_codes!`, which declares [`Code`](crate::findings::Code) from
//! the list of every code.

use crate::kinds::Severity;
use crate::registry::CheckId;

/// What raises a code: the docs' "check" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised {
    /// Any check (a crash, an error, a hang).
    AnyCheck,
    /// Checks without a wrong-result code of their own.
    OtherChecks,
    /// The model checks.
    ModelChecks,
    /// Every check with a headline figure (judged against its fleet baseline).
    HeadlineChecks,
    Check(CheckId),
    /// The launcher's run as a whole.
    Run,
    /// The nodes' rendezvous.
    Rendezvous,
    /// The node's devices, judged by the launcher before any check.
    Device,
    /// The service's supervision.
    Service,
}

impl Raised {
    pub fn label(self) -> &'static str {
        match self {
            Raised::AnyCheck => "any",
            Raised::OtherChecks => "other checks",
            Raised::ModelChecks => "model checks",
            Raised::HeadlineChecks => "checks with a headline figure",
            Raised::Check(id) => id.as_str(),
            Raised::Run => "run",
            Raised::Rendezvous => "rendezvous",
            Raised::Device => "device",
            Raised::Service => "service",
        }
    }
}

/// A code's row of docs/findings.md.
#[derive(Debug, Clone, Copy)]
pub struct CodeDoc {
    /// The worst severity it is raised at.
    pub severity: Severity,
    /// The severities as the docs state them, with when each applies.
    pub severity_text: &'static str,
    pub raised: &'static [Raised],
    /// Where it is placed: rank, node, pair, job...
    pub placed: &'static str,
    pub meaning: &'static str,
    pub action: &'static str,
}

/// Declares [`Code`](crate::findings::Code), its spelling and its documentation from the list
/// of every code (gathered in [`crate::checks`]).
macro_rules! finding_codes {
    ($($v:ident = $code:literal, $sev:ident, $sev_text:literal, [$($raised:expr),+], $placed:literal,
        $meaning:literal, $action:literal;)+) => {
        /// A finding's stable code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code {
            $(#[doc = $meaning] $v,)+
        }

        impl Code {
            /// Every code, in the docs' order.
            pub const ALL: [Code; [$(Code::$v),+].len()] = [$(Code::$v),+];

            /// The code as report.json spells it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$v => $code,)+
                }
            }

            /// Its documentation.
            pub fn doc(self) -> $crate::findings::doc::CodeDoc {
                use $crate::findings::doc::Raised::*;
                match self {
                    $(Code::$v => $crate::findings::doc::CodeDoc {
                        severity: $crate::kinds::Severity::$sev,
                        severity_text: $sev_text,
                        raised: &[$($raised),+],
                        placed: $placed,
                        meaning: $meaning,
                        action: $action,
                    },)+
                }
            }
        }
    };
}
pub(crate) use finding_codes;
