//! The simulator's integration tests, one binary: each module is one subject, named by its
//! file.

mod sim_accounts;
mod sim_alert;
mod sim_api;
mod sim_faults;
mod sim_kubelet;
mod sim_perf;
mod sim_pickup;
mod sim_project;
mod sim_replay_4_21;
mod sim_scaling;
mod sim_scenario;
mod sim_throttling;
