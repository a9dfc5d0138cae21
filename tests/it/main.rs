//! The provider's integration tests, one binary (linking one test binary per file dominated
//! the build): each module is one subject, named by its file.

mod alert_verdict;
mod architecture;
mod check;
mod client_binding;
mod deploy_apply;
mod deploy_manifests;
mod external_nodes;
mod fault_campaign;
mod faults;
mod kube_store;
mod leader;
mod node_marks;
mod ops_operator;
mod prop_client;
mod prop_parsers;
mod provider_pickup;
mod provider_rpcs;
mod refresh_coalescing;
mod scale_down_merging;
mod scenario_concurrency;
mod scenario_failures;
mod scenario_project_key;
mod scenario_refusals;
mod scenario_removal_promises;
mod scenario_scale_from_zero;
mod scenario_scaling;
mod scenario_stranded;
mod scenario_wire_generations;
mod secrets_in_logs;
mod soak;
mod template_fixture;
mod throttling;
mod tls;
mod wire_generations;
