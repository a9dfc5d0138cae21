//! A mock cluster-autoscaler: a gRPC client that replays the autoscaler's use of the
//! externalgrpc protocol, for tests and the demo.
