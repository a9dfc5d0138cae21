//! The lab: what exercises the provider without a real autoscaler or CloudStack. A mock
//! cluster-autoscaler ([`autoscaler`]) that replays the real one's use of the externalgrpc
//! protocol, and the `cks-demo` binary ([`demo`]) that plays scenarios against the simulator.
//! Nothing here is linked into the production binary.

pub mod autoscaler;
pub mod demo;

/// The externalgrpc wire, as the mock autoscaler's client speaks it.
pub(crate) use cks_proto as pb;
