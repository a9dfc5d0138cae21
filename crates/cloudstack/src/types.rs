//! CloudStack response objects, as the API sends them. Lenient where CloudStack is loose:
//! numbers that arrive as strings (`cpunumber`, `memory`), absent optional fields, unknown
//! fields ignored.

use serde::Deserialize;

/// One element of `listkubernetesclustersresponse.kubernetescluster[]` (and of a scale job's
/// `jobresult.kubernetescluster`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct KubernetesCluster {
    pub id: String,
    pub name: String,
    pub state: String,
    /// Worker count.
    #[serde(default, deserialize_with = "lenient::u64")]
    pub size: u64,
    #[serde(default, deserialize_with = "lenient::u64")]
    pub controlnodes: u64,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub etcdnodes: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub minsize: Option<u64>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub maxsize: Option<u64>,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub autoscalingenabled: bool,
    #[serde(default)]
    pub serviceofferingid: Option<String>,
    #[serde(default)]
    pub serviceofferingname: Option<String>,
    #[serde(default)]
    pub workerofferingid: Option<String>,
    #[serde(default)]
    pub workerofferingname: Option<String>,
    #[serde(default)]
    pub zoneid: Option<String>,
    #[serde(default)]
    pub zonename: Option<String>,
    #[serde(default)]
    pub kubernetesversionname: Option<String>,
    /// `CloudManaged` or `ExternalManaged`.
    #[serde(default)]
    pub clustertype: Option<String>,
    #[serde(default)]
    pub virtualmachines: Vec<ClusterVm>,
}

/// One element of a cluster's `virtualmachines[]` (KubernetesUserVmResponse).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ClusterVm {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub state: String,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub isexternalnode: bool,
    #[serde(default, deserialize_with = "lenient::bool")]
    pub isetcdnode: bool,
    #[serde(default)]
    pub kubernetesnodeversion: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
}

/// An element of `listvirtualmachinesresponse.virtualmachine[]` (UserVmResponse), and the
/// `jobresult.virtualmachine` of a VM job such as `stopVirtualMachine`: only what the provider
/// reads.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct VirtualMachine {
    pub id: String,
    #[serde(default)]
    pub name: String,
    /// `VirtualMachine.State` by name: Running, Stopped, Stopping, Starting, Destroyed,
    /// Expunging, Error, Shutdown, Migrating, Unknown...
    #[serde(default)]
    pub state: String,
    /// Its service offering, as `listVirtualMachines` shows it (UserVmResponse): what the
    /// template node is built from when the key may not call `listServiceOfferings`.
    #[serde(default)]
    pub serviceofferingid: Option<String>,
    #[serde(default)]
    pub serviceofferingname: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub cpunumber: Option<u64>,
    /// MiB.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub memory: Option<u64>,
}

impl VirtualMachine {
    /// The VM's offering as far as the VM shows it (CPUs and memory; no root disk size, GPU
    /// or details), when it names its offering and sizes.
    pub fn offering(&self) -> Option<ServiceOffering> {
        Some(ServiceOffering {
            id: self.serviceofferingid.clone()?,
            name: self.serviceofferingname.clone().unwrap_or_default(),
            cpunumber: Some(self.cpunumber?),
            memory: Some(self.memory?),
            cpuspeed: None,
            rootdisksize: None,
            serviceofferingdetails: None,
            vgpuprofilename: None,
            gpucount: None,
            gpucardname: None,
        })
    }
}

/// `queryasyncjobresultresponse` / an element of `listasyncjobsresponse.asyncjobs[]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct AsyncJob {
    pub jobid: String,
    /// 0 in progress, 1 succeeded, 2 failed, 3 cancelled.
    #[serde(deserialize_with = "lenient::i64")]
    pub jobstatus: i64,
    #[serde(default, deserialize_with = "lenient::i64")]
    pub jobresultcode: i64,
    #[serde(default)]
    pub jobresult: Option<serde_json::Value>,
    #[serde(default)]
    pub jobinstancetype: Option<String>,
    #[serde(default)]
    pub jobinstanceid: Option<String>,
    #[serde(default)]
    pub cmd: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
}

/// Where a job stands, with the failure text pulled out of `jobresult`.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    Pending,
    /// The job's `jobresult.kubernetescluster` when present.
    Succeeded(Option<Box<KubernetesCluster>>),
    Failed {
        errorcode: i64,
        errortext: String,
    },
    Cancelled,
}

impl AsyncJob {
    /// Interprets `jobstatus`/`jobresult` (failure text from `jobresult.errortext`).
    pub fn outcome(&self) -> JobOutcome {
        match self.jobstatus {
            0 => JobOutcome::Pending,
            1 => JobOutcome::Succeeded(self.result_cluster().map(Box::new)),
            2 => {
                let (errorcode, errortext) = self.failure_details();
                JobOutcome::Failed {
                    errorcode,
                    errortext,
                }
            }
            3 => JobOutcome::Cancelled,
            other => {
                let (errorcode, detail) = self.failure_details();
                JobOutcome::Failed {
                    errorcode,
                    errortext: format!("job {} has unknown status {other}: {detail}", self.jobid),
                }
            }
        }
    }

    /// `jobresult.virtualmachine` of a finished VM job (`stopVirtualMachine`'s result object,
    /// `StopVMCmd.getResultObjectName`), when present and readable.
    pub fn result_virtual_machine(&self) -> Option<VirtualMachine> {
        let value = self.jobresult.as_ref()?.get("virtualmachine")?;
        match VirtualMachine::deserialize(value) {
            Ok(vm) => Some(vm),
            Err(err) => {
                tracing::debug!(jobid = %self.jobid, error = %err, "job result VM unreadable");
                None
            }
        }
    }

    /// `jobresult.kubernetescluster`, when present and readable.
    fn result_cluster(&self) -> Option<KubernetesCluster> {
        let value = self.jobresult.as_ref()?.get("kubernetescluster")?;
        match KubernetesCluster::deserialize(value) {
            Ok(cluster) => Some(cluster),
            Err(err) => {
                tracing::debug!(jobid = %self.jobid, error = %err, "job result cluster unreadable");
                None
            }
        }
    }

    /// Error code and text of a failed job: `jobresult.errorcode`/`errortext` first (the shape
    /// CloudStack uses), then `jobresultcode` and a generic text.
    fn failure_details(&self) -> (i64, String) {
        let result = self.jobresult.as_ref();
        let code_in_result = result.and_then(|r| r.get("errorcode")).and_then(|c| {
            c.as_i64()
                .or_else(|| c.as_str().and_then(|s| s.trim().parse().ok()))
        });
        let errorcode = code_in_result.unwrap_or(self.jobresultcode);
        let text = match result {
            // `jobresulttype: "text"` jobs carry the message as a bare string.
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
            Some(r) => r
                .get("errortext")
                .and_then(|t| t.as_str())
                .filter(|t| !t.trim().is_empty())
                .map(str::to_string),
            None => None,
        };
        let errortext = text.unwrap_or_else(|| {
            format!(
                "job {} failed without an error text (result code {errorcode})",
                self.jobid
            )
        });
        (errorcode, errortext)
    }
}

/// An element of `listasyncjobsresponse.asyncjobs[]` as a search for running jobs reads it:
/// without `jobresult`, which for a finished scale job holds the whole cluster.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ListedJob {
    pub jobid: String,
    /// 0 in progress, 1 succeeded, 2 failed, 3 cancelled.
    #[serde(deserialize_with = "lenient::i64")]
    pub jobstatus: i64,
    #[serde(default)]
    pub jobinstanceid: Option<String>,
    #[serde(default)]
    pub cmd: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
}

impl ListedJob {
    /// A `scaleKubernetesCluster` job still in progress (queued or running), of any cluster:
    /// CloudStack's scale jobs name no instance (`ScaleKubernetesClusterCmd` does not override
    /// `BaseCmd.getApiResourceId()`; apache/cloudstack issue #11166's job dump has neither
    /// `jobinstancetype` nor `jobinstanceid`), so the cluster is told by other means.
    pub fn is_running_scale(&self) -> bool {
        self.jobstatus == 0
            && self
                .cmd
                .as_deref()
                .is_some_and(|c| c.ends_with("ScaleKubernetesClusterCmd"))
    }

    /// When CloudStack created it, in seconds since the Unix epoch (`None` when absent or not
    /// in CloudStack's date format).
    pub fn created_unix(&self) -> Option<u64> {
        self.created.as_deref().and_then(parse_cloudstack_date)
    }
}

/// Reads CloudStack's `yyyy-MM-dd'T'HH:mm:ssZ` (e.g. `2022-04-18T06:21:58+0000`) as seconds
/// since the Unix epoch; the inverse of [`cloudstack_date`], any UTC offset allowed.
pub fn parse_cloudstack_date(s: &str) -> Option<u64> {
    let s = s.trim();
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    if s.len() != 24 || s.get(4..5)? != "-" || s.get(10..11)? != "T" {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let sign = match s.get(19..20)? {
        "+" => 1,
        "-" => -1,
        _ => return None,
    };
    let offset = sign * (num(20..22)? * 3600 + num(22..24)? * 60);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Howard Hinnant's days-from-civil algorithm.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss - offset).ok()
}

/// `unix_secs` (seconds since the Unix epoch) as CloudStack writes and reads dates:
/// `yyyy-MM-dd'T'HH:mm:ssZ` in UTC, e.g. `2022-04-18T06:21:58+0000`.
pub fn cloudstack_date(unix_secs: u64) -> String {
    // Howard Hinnant's days-to-civil algorithm.
    let days = i64::try_from(unix_secs / 86_400).unwrap_or(i64::MAX / 2) + 719_468;
    let rem = unix_secs % 86_400;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}+0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The UTC date of `unix_secs` as CloudStack's DATE parameters take it: `yyyy-MM-dd`.
pub fn cloudstack_day(unix_secs: u64) -> String {
    let mut stamp = cloudstack_date(unix_secs);
    stamp.truncate(10);
    stamp
}

/// An element of `listserviceofferingsresponse.serviceoffering[]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ServiceOffering {
    pub id: String,
    pub name: String,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub cpunumber: Option<u64>,
    /// MiB.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub memory: Option<u64>,
    /// MHz.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub cpuspeed: Option<u64>,
    /// GiB, when the offering fixes the root disk size.
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub rootdisksize: Option<u64>,
    /// e.g. GPU details (`pciDevice`, `vgpuType`) on GPU offerings.
    #[serde(default)]
    pub serviceofferingdetails: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub vgpuprofilename: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_u64")]
    pub gpucount: Option<u64>,
    #[serde(default)]
    pub gpucardname: Option<String>,
}

/// Deserializers for numbers and booleans that CloudStack sends either natively or as strings
/// (`"cpunumber": "4"`). Used with `#[serde(deserialize_with = "…")]`.
pub mod lenient {
    use serde::de::{self, Deserializer, Visitor};
    use std::fmt;

    /// A JSON number or numeric string, as `u64`.
    pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match d.deserialize_any(NumVisitor)? {
            Some(n) => u64::try_from(n)
                .map_err(|_| de::Error::custom(format!("{n} is not an unsigned count"))),
            None => Err(de::Error::custom(
                "expected a number, got null or an empty string",
            )),
        }
    }

    /// Like [`u64()`], with `null` and `""` as `None`.
    pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match d.deserialize_any(NumVisitor)? {
            Some(n) => u64::try_from(n)
                .map(Some)
                .map_err(|_| de::Error::custom(format!("{n} is not an unsigned count"))),
            None => Ok(None),
        }
    }

    /// A JSON number or numeric string, as `i64`.
    pub fn i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        match d.deserialize_any(NumVisitor)? {
            Some(n) => {
                i64::try_from(n).map_err(|_| de::Error::custom(format!("{n} is out of range")))
            }
            None => Err(de::Error::custom(
                "expected a number, got null or an empty string",
            )),
        }
    }

    /// Like [`i64()`], with `null` and `""` as `None`.
    pub fn opt_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        match d.deserialize_any(NumVisitor)? {
            Some(n) => i64::try_from(n)
                .map(Some)
                .map_err(|_| de::Error::custom(format!("{n} is out of range"))),
            None => Ok(None),
        }
    }

    /// A JSON boolean or `"true"`/`"false"` string; `null` is false.
    pub fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        d.deserialize_any(BoolVisitor)
    }

    /// Any integer as `i128`, so one visitor serves both signed and unsigned targets.
    struct NumVisitor;

    impl<'de> Visitor<'de> for NumVisitor {
        type Value = Option<i128>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer or a string holding an integer")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(i128::from(v)))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(i128::from(v)))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            // Whole floats (`4096.0`) are accepted; fractions are not counts.
            if v.fract() == 0.0 && v.is_finite() && v.abs() < 9.0e18 {
                #[allow(clippy::cast_possible_truncation)]
                Ok(Some(v as i128))
            } else {
                Err(E::custom(format!("{v} is not a whole number")))
            }
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            let t = v.trim();
            if t.is_empty() {
                return Ok(None);
            }
            t.parse::<i128>()
                .map(Some)
                .map_err(|_| E::custom(format!("{v:?} is not an integer")))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }

    struct BoolVisitor;

    impl<'de> Visitor<'de> for BoolVisitor {
        type Value = bool;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a boolean or \"true\"/\"false\"")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v.trim().to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" | "" => Ok(false),
                _ => Err(E::custom(format!("{v:?} is not a boolean"))),
            }
        }
        fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_none<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
    }
}

#[cfg(test)]
mod date_tests {
    use super::cloudstack_date;

    #[test]
    fn dates_are_written_as_cloudstack_reads_them() {
        assert_eq!(cloudstack_date(0), "1970-01-01T00:00:00+0000");
        assert_eq!(cloudstack_date(1_650_262_918), "2022-04-18T06:21:58+0000");
        // 29 February of a leap year, and the last second of a year.
        assert_eq!(cloudstack_date(1_709_210_096), "2024-02-29T12:34:56+0000");
        assert_eq!(cloudstack_date(1_735_689_599), "2024-12-31T23:59:59+0000");
    }

    #[test]
    fn days_are_the_utc_date_alone() {
        assert_eq!(super::cloudstack_day(1_735_689_599), "2024-12-31");
        assert_eq!(super::cloudstack_day(1_735_689_600), "2025-01-01");
    }
}
