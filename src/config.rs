//! Configuration sources: the CloudStack cloud-config (ini) and `--nodes` specs.
