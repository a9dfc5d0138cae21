//! NodeGroupGetOptions: per-cluster autoscaling option overrides.
