//! Every fuzz target's body on stable Rust, as a plain test: seed inputs and their mutations
//! (bit flips, interesting bytes, dictionary tokens, cuts, splices) and random bytes, drawn from
//! a seeded generator, then whatever a local fuzzing run left in `fuzz/corpus/<target>/` and
//! `fuzz/artifacts/<target>/`. Each target's invariants (`cks_fuzz::decision`,
//! `cks_fuzz::parsers`) panic on a broken one; the replay also requires the inputs to reach
//! both sides of each check (accepted and refused, every kind of answer), so a generator that
//! stopped reaching them fails too.
//!
//! `CKS_FUZZ_RUNS` (inputs per target, default 20,000) and `CKS_FUZZ_SEED` (default fixed) change
//! the run; a failure names the target, the seed and the input.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;

const DEFAULT_RUNS: usize = 20_000;
const DEFAULT_SEED: u64 = 0x0c5a_11ce;
/// An answer seen at most this often so far is rare: its input joins the pool.
const RARE: usize = 20;
const POOL_MAX: usize = 2000;

fn runs() -> usize {
    std::env::var("CKS_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RUNS)
}

fn seed() -> u64 {
    std::env::var("CKS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

/// The directory of the fuzz crate.
fn fuzz_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Inputs a target's fuzzing starts from: well-formed cases its check accepts and near misses.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let text: &[&str] = match target {
        "cloudstack_json" => &[
            r#"{"listkubernetesclustersresponse":{"count":1,"kubernetescluster":[{"id":"c-1","name":"k8s","state":"Running","size":2,"controlnodes":1,"etcdnodes":0,"minsize":1,"maxsize":5,"autoscalingenabled":false,"zoneid":"z","zonename":"zone1","serviceofferingid":"o-1","virtualmachines":[{"id":"vm-1","name":"k8s-control-18c0a1","state":"Running"},{"id":"vm-2","name":"k8s-node-18c0c1","state":"Stopped","isexternalnode":false,"isetcdnode":"false"}]}]}}"#,
            r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":0,"jobresultcode":0}}"#,
            r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":1,"jobresultcode":0,"jobresult":{"kubernetescluster":{"id":"c-1","name":"k8s","state":"Running","size":"3"}}}}"#,
            r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":2,"jobresultcode":530,"jobresult":{"errorcode":"533","errortext":"Insufficient capacity"}}}"#,
            r#"{"queryasyncjobresultresponse":{"jobid":"j-1","jobstatus":7,"jobresultcode":530,"jobresult":"failed"}}"#,
            r#"{"listasyncjobsresponse":{"count":1,"asyncjob":[{"jobid":"j-2","cmd":"org.apache.cloudstack.api.command.user.kubernetes.cluster.ScaleKubernetesClusterCmd","jobstatus":0,"created":"2024-05-01T10:00:00+0000","jobinstanceid":"c-1"}]}}"#,
            r#"{"listserviceofferingsresponse":{"count":1,"serviceoffering":[{"id":"o-1","name":"Medium","cpunumber":2,"memory":4096}]}}"#,
            r#"{"errorresponse":{"errorcode":431,"cserrorcode":4350,"errortext":"Unable to execute API command due to invalid value"}}"#,
        ],
        "cloud_config" => &[
            "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = AbCdEf123\nsecret-key = \"s3cr;et#=\"\n",
            "[global]\r\nAPI-URL=http://10.0.0.1:8080/client/api ; comment\r\napi-key=k\r\nsecret-key=s\\\r\n",
            "; only a comment\n[Other]\nkey = value\n",
            "[Global]\napi-url = ftp://nowhere\napi-key =\n",
        ],
        "nodes_spec" => &[
            "1:10:k8s",
            "0:5:5a1e7c9e-0b43-4a5c-9f2b-1c6d8e7f9a0b",
            "2:3:id=cluster-1",
            " 1 : 4 : name=prod ",
            "5:1:k8s",
            "1:10001:k8s",
            "1:10:",
        ],
        "provider_id" => &[
            "cloudstack:///5a1e7c9e-0b43-4a5c-9f2b-1c6d8e7f9a0b",
            "external-grpc://vm-1",
            "vm-1",
            "aws://",
            "",
        ],
        // Its bytes are decoded by `Arbitrary`: random bytes are its seeds.
        _ => &[],
    };
    text.iter().map(|s| s.as_bytes().to_vec()).collect()
}

/// Tokens to insert: a few bytes every parser here cares about, and the target's libFuzzer
/// dictionary (`<target>.dict`) when it has one.
fn dictionary(target: &str) -> Vec<Vec<u8>> {
    let mut tokens: Vec<Vec<u8>> = "\" { } [ ] : , = ; # \\ :// - 0 -1 4294967296 null true"
        .split(' ')
        .chain(["\n", "\r\n"])
        .map(|t| t.as_bytes().to_vec())
        .collect();
    if let Ok(dict) = std::fs::read_to_string(fuzz_dir().join(format!("{target}.dict"))) {
        for line in dict.lines().filter(|l| !l.starts_with('#')) {
            let quoted = line.split_once('=').map_or(line, |(_, q)| q).trim();
            if let Some(token) = quoted.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
                tokens.push(token.replace("\\\"", "\"").into_bytes());
            }
        }
    }
    tokens
}

/// One input: random bytes now and then (half of them small numbers, which `Arbitrary` reads as
/// short lengths and first variants), else an input of the pool with one to four mutations.
fn generate(rng: &mut StdRng, pool: &[Vec<u8>], dict: &[Vec<u8>]) -> Vec<u8> {
    if pool.is_empty() || rng.random_ratio(1, 8) {
        let len = rng.random_range(0..=256);
        return (0..len)
            .map(|_| {
                if rng.random() {
                    rng.random_range(0..8)
                } else {
                    rng.random()
                }
            })
            .collect();
    }
    let mut data = pool[rng.random_range(0..pool.len())].clone();
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..=data.len());
        match rng.random_range(0..6) {
            0 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] = *[0u8, 1, 0xff, 0x7f, 0x80, b'"', b'9', b' ', 0xc3]
                    .get(rng.random_range(0..9))
                    .expect("in range");
            }
            2 => {
                let token = &dict[rng.random_range(0..dict.len())];
                data.splice(at..at, token.iter().copied());
            }
            3 => {
                let end = rng.random_range(at..=data.len());
                data.drain(at..end);
            }
            4 => data.truncate(at),
            _ => {
                let other = &pool[rng.random_range(0..pool.len())];
                let from = rng.random_range(0..=other.len());
                data.splice(at..at, other[from..].iter().copied());
            }
        }
    }
    data
}

/// The files a local fuzzing run left for `target`.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.path().is_file()
                && let Ok(bytes) = std::fs::read(entry.path())
            {
                out.push(bytes);
            }
        }
    }
    out
}

/// Runs `body` on `data`; a panic (a broken invariant) fails the test naming the input.
fn run(target: &str, body: fn(&[u8]) -> &'static str, data: &[u8], origin: &str) -> &'static str {
    match std::panic::catch_unwind(|| body(data)) {
        Ok(label) => label,
        Err(_) => panic!(
            "fuzz target {target} broke an invariant (its message is above) on the input \
             {origin} ({} bytes): {:?}",
            data.len(),
            String::from_utf8_lossy(data)
        ),
    }
}

/// What a target's inputs turned out to be, label → count.
fn replay(target: &str) -> BTreeMap<&'static str, usize> {
    let (_, body) = cks_fuzz::targets::ALL
        .into_iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no fuzz target {target}"));
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed ^ target.len() as u64);
    let dict = dictionary(target);
    let mut labels: BTreeMap<&'static str, usize> = BTreeMap::new();
    // The pool mutations start from: the seeds, then every input that gave an answer seen
    // rarely so far, so that rare answers (an acceptance, a late rule) get explored around.
    let mut pool = Vec::new();
    for (i, data) in seeds(target).into_iter().enumerate() {
        *labels
            .entry(run(target, body, &data, &format!("seed #{i}")))
            .or_default() += 1;
        pool.push(data);
    }
    for i in 0..runs() {
        let data = generate(&mut rng, &pool, &dict);
        let origin = format!("#{i} of seed {seed} (CKS_FUZZ_SEED)");
        let seen = labels.entry(run(target, body, &data, &origin)).or_default();
        *seen += 1;
        if *seen <= RARE && pool.len() < POOL_MAX {
            pool.push(data);
        }
    }
    for (i, data) in corpus(target).iter().enumerate() {
        run(target, body, data, &format!("corpus file #{i}"));
    }
    eprintln!("{target}: {labels:?}");
    labels
}

/// `labels` has each of `wanted` at least `min` times.
fn assert_reached(target: &str, labels: &BTreeMap<&str, usize>, wanted: &[&str], min: usize) {
    for label in wanted {
        assert!(
            labels.get(label).copied().unwrap_or(0) >= min,
            "{target}: the inputs reach {label:?} fewer than {min} times: {labels:?}"
        );
    }
}

/// The share of the default run a label must reach: at least one input in 100.
fn often() -> usize {
    runs() / 100
}

#[test]
fn every_target_is_replayed() {
    let names: Vec<&str> = cks_fuzz::targets::ALL.iter().map(|(n, _)| *n).collect();
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("Cargo.toml");
    let bins: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|bin| {
            bin.lines()
                .find_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"'))
        })
        .collect();
    assert_eq!(
        bins, names,
        "the [[bin]] targets of Cargo.toml are targets::ALL"
    );
    for name in names {
        let source = std::fs::read_to_string(fuzz_dir().join(format!("fuzz_targets/{name}.rs")))
            .unwrap_or_else(|e| panic!("fuzz_targets/{name}.rs: {e}"));
        assert!(
            source.contains(&format!("cks_fuzz::targets::{name}(data)")),
            "fuzz_targets/{name}.rs runs targets::{name}, the body the replay runs"
        );
    }
}

#[test]
fn cloudstack_json_keeps_its_invariants() {
    let labels = replay("cloudstack_json");
    assert_reached("cloudstack_json", &labels, &["json", "not-json"], often());
}

#[test]
fn cloud_config_keeps_its_invariants() {
    let labels = replay("cloud_config");
    assert_reached("cloud_config", &labels, &["accepted", "refused"], often());
}

#[test]
fn nodes_spec_keeps_its_invariants() {
    let labels = replay("nodes_spec");
    assert_reached("nodes_spec", &labels, &["accepted", "refused"], often());
}

#[test]
fn provider_id_keeps_its_invariants() {
    let labels = replay("provider_id");
    assert_reached(
        "provider_id",
        &labels,
        &["names-a-vm", "names-none"],
        often(),
    );
}

#[test]
fn scale_decision_keeps_its_invariants() {
    let labels = replay("scale_decision");
    assert_reached("scale_decision", &labels, &["ok"], often());
    let rules: Vec<&&str> = labels
        .keys()
        .filter(|l| cks_fuzz::decision::RULES.contains(l))
        .collect();
    assert!(
        rules.len() >= 8,
        "scale_decision: random bytes reach only the rules {rules:?}: {labels:?}"
    );
    let decoded: usize = labels
        .iter()
        .filter(|(l, _)| **l != "undecodable")
        .map(|(_, n)| n)
        .sum();
    assert!(
        decoded * 2 >= runs(),
        "scale_decision: fewer than half the inputs decode to a case: {labels:?}"
    );
}
