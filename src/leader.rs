//! Leader election's I/O: every retry period the Lease is read and written as
//! [`cks_domain::lease::Elector`] decides, and [`Leadership`] tells the rest of the process
//! whether it may act now (submit to CloudStack, write the ledger, promise). The decisions
//! (when a Lease may be taken, when a leader must stop) are the domain's; this module owns
//! the loop, its timeouts and the transitions it reports.
//!
//! A leader that cannot renew stops leading a renew deadline after its last renewal was sent,
//! whether or not its loop still runs: [`Leadership::leading`] reads the elector's clock
//! check at every call, so a stuck loop fences too.

use crate::kube::{KubeClient, KubeConfig, KubeError};
use cks_domain::lease::{Attempt, Elector, LeaseTimings};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;
use tokio::time::Instant;

/// The Lease: where it is and how to reach the API server.
#[derive(Debug, Clone)]
pub struct LeaseRef {
    pub namespace: String,
    pub name: String,
    pub api: KubeConfig,
}

/// What a replica is, as its loop last found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Another replica holds the Lease, or none could be read yet.
    Standby,
    /// This replica holds the Lease and renewed it in time.
    Leader,
    /// This replica led and could not renew in time: it must not act again (the process
    /// ends; a new one starts as a standby).
    Lost,
}

/// Whether this replica may act, shared by every part of the process that acts.
#[derive(Clone)]
pub struct Leadership {
    elector: Arc<Mutex<Elector>>,
    role: watch::Sender<Role>,
    /// The leader has taken over the ledger (its first read after acquiring the Lease): only
    /// then are RPCs answered, from what it holds.
    taken_over: Arc<AtomicBool>,
    /// A standby has labelled its pod `standby` (or has no pod to label): only then is it
    /// Ready, so that a restarted replica whose pod still carries the `leader` label of its
    /// previous life is never a Ready endpoint of the leader's Service.
    labelled: Arc<AtomicBool>,
    /// A standby read and parsed the ledger at its last look: it could take over. Only then is
    /// it Ready, so that a rolling update whose new pods cannot read the ledger (a format they
    /// do not know, a Role without the ConfigMap's verbs) stops before it replaces the leader.
    ledger_readable: Arc<AtomicBool>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("role", &*self.role.borrow())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    pub fn new(identity: &str, timings: LeaseTimings) -> Leadership {
        Leadership {
            elector: Arc::new(Mutex::new(Elector::new(identity, timings))),
            role: watch::Sender::new(Role::Standby),
            taken_over: Arc::new(AtomicBool::new(false)),
            labelled: Arc::new(AtomicBool::new(false)),
            ledger_readable: Arc::new(AtomicBool::new(false)),
        }
    }

    fn elector(&self) -> MutexGuard<'_, Elector> {
        // A panic while holding the lock leaves the elector as it was: still usable.
        self.elector.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this replica may act now: it holds the Lease and its last renewal was sent
    /// less than the renew deadline ago.
    pub fn leading(&self) -> bool {
        self.elector().leading(Instant::now().into_std())
    }

    /// Whether RPCs are answered: this replica leads and has taken over the ledger.
    pub fn serving(&self) -> bool {
        self.taken_over.load(Ordering::Acquire) && self.leading()
    }

    /// The leader has read the ledger and claimed the store: RPCs are answered from now on.
    pub fn set_taken_over(&self) {
        self.taken_over.store(true, Ordering::Release);
    }

    /// The replica holding the Lease as last read (for a standby's answers), if any.
    pub fn holder(&self) -> Option<String> {
        self.elector().holder().map(str::to_string)
    }

    /// The standby's pod carries the `standby` label (or there is no pod to label).
    pub fn set_labelled_standby(&self) {
        self.labelled.store(true, Ordering::Release);
    }

    /// Whether a standby may report Ready: its pod no longer carries a stale `leader` label,
    /// and it could read the ledger at its last look.
    pub fn ready_standby(&self) -> bool {
        self.labelled.load(Ordering::Acquire) && self.ledger_readable.load(Ordering::Acquire)
    }

    /// The outcome of a standby's last read of the ledger.
    pub fn set_ledger_readable(&self, readable: bool) {
        self.ledger_readable.store(readable, Ordering::Release);
    }

    /// Whether the ledger was taken over (see [`Leadership::set_taken_over`]).
    pub fn taken_over(&self) -> bool {
        self.taken_over.load(Ordering::Acquire)
    }

    pub fn timings(&self) -> LeaseTimings {
        self.elector().timings()
    }

    pub fn identity(&self) -> String {
        self.elector().identity().to_string()
    }

    /// The role as the loop last found it; changes are sent to every receiver.
    pub fn watch(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    fn set_role(&self, role: Role) {
        self.role.send_if_modified(|r| {
            let changed = *r != role;
            *r = role;
            changed
        });
    }
}

/// Reads and writes the Lease every retry period until `stop` turns true (then a held Lease
/// is released, so a standby takes it at its next round) or leadership is lost (returns
/// [`Role::Lost`] at once). A round that fails (the API server down, a conflict with another
/// replica's write) is tried again at the next period; only the renew deadline decides.
pub async fn run(
    lease: LeaseRef,
    leadership: Leadership,
    mut stop: watch::Receiver<bool>,
) -> Result<Role, KubeError> {
    let client = KubeClient::new(&lease.api)?;
    let timings = leadership.elector().timings();
    let shown = format!("lease {}/{}", lease.namespace, lease.name);
    let mut led = false;
    loop {
        let sent = Instant::now();
        // One round may not outlast the renew deadline: past it the answer no longer counts.
        let round = tokio::time::timeout(
            timings.renew_deadline,
            round(&client, &lease, &leadership, sent),
        )
        .await;
        match round {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_conflict() => {
                tracing::debug!(lease = %shown, error = %e, "another replica wrote the lease first");
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %shown, error = %e, "leader election round failed")
            }
            Err(_) => {
                tracing::warn!(lease = %shown, "leader election round not answered within the renew deadline")
            }
        }
        let leading = leadership.leading();
        if leading && !led {
            led = true;
            tracing::info!(lease = %shown, identity = %leadership.identity(), "became the leader: this replica acts from now on");
            crate::metrics::record_leader(true);
            leadership.set_role(Role::Leader);
        } else if led && !leading {
            tracing::error!(lease = %shown, identity = %leadership.identity(), deadline = ?timings.renew_deadline,
                "LOST the lease: not renewed within the renew deadline; this replica stops acting (nothing more is sent to CloudStack or promised) and exits");
            crate::metrics::record_leader(false);
            leadership.set_role(Role::Lost);
            return Ok(Role::Lost);
        } else if !leading {
            leadership.set_role(Role::Standby);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(sent + timings.retry_period) => {}
            () = stopped(&mut stop) => {
                if led {
                    release(&client, &lease, &leadership, &shown).await;
                    crate::metrics::record_leader(false);
                }
                leadership.set_role(Role::Standby);
                return Ok(Role::Standby);
            }
        }
    }
}

/// Completes once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// One read and, unless another replica holds the Lease, one write.
async fn round(
    client: &KubeClient,
    lease: &LeaseRef,
    leadership: &Leadership,
    sent: Instant,
) -> Result<(), KubeError> {
    let read = client.get_lease(&lease.namespace, &lease.name).await?;
    let (version, record) = match &read {
        Some((v, r)) => (Some(v.as_str()), Some(r)),
        None => (None, None),
    };
    let attempt = leadership
        .elector()
        .attempt(record, sent.into_std(), &wall_now());
    let record = match attempt {
        Attempt::Held { .. } => return Ok(()),
        Attempt::Create(r) => r,
        Attempt::Update(r) => r,
    };
    client
        .write_lease(&lease.namespace, &lease.name, version, &record)
        .await?;
    leadership.elector().written(record, sent.into_std());
    Ok(())
}

/// Gives the Lease up (a leader stopping on purpose): the standby takes it at its next round
/// rather than a lease duration later. A failure only costs that wait.
async fn release(client: &KubeClient, lease: &LeaseRef, leadership: &Leadership, shown: &str) {
    let result = async {
        let read = client.get_lease(&lease.namespace, &lease.name).await?;
        let Some((version, held)) = read else {
            return Ok(false);
        };
        let record = {
            let mut elector = leadership.elector();
            if held.holder != elector.identity() {
                return Ok(false);
            }
            elector.release(&wall_now())
        };
        let Some(record) = record else {
            return Ok(false);
        };
        client
            .write_lease(&lease.namespace, &lease.name, Some(&version), &record)
            .await
            .map(|_| true)
    };
    match tokio::time::timeout(std::time::Duration::from_secs(5), result).await {
        Ok(Ok(true)) => {
            tracing::info!(lease = %shown, "lease released: the standby takes over at its next round")
        }
        Ok(Ok(false)) => {}
        Ok(Err(e)) => {
            tracing::warn!(lease = %shown, error = %e, "could not release the lease: the standby takes over once it expires")
        }
        Err(_) => {
            tracing::warn!(lease = %shown, "releasing the lease timed out: the standby takes over once it expires")
        }
    }
}

/// Now, as a Lease's `renewTime` holds it.
fn wall_now() -> String {
    lease_time(time::OffsetDateTime::now_utc())
}

/// `t` as a Lease's times hold it: `MicroTime`, which the API server parses with Go's layout
/// `2006-01-02T15:04:05.000000Z07:00` (`RFC3339Micro`, k8s.io/apimachinery
/// `pkg/apis/meta/v1/micro_time.go`): exactly six fractional digits, here in UTC.
fn lease_time(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_times_have_six_fractional_digits_in_utc() {
        let t = |nanos: i128| {
            lease_time(
                time::OffsetDateTime::from_unix_timestamp_nanos(
                    1_796_378_400 * 1_000_000_000 + nanos,
                )
                .expect("a time"),
            )
        };
        assert_eq!(t(123_456_789), "2026-12-04T10:00:00.123456Z");
        assert_eq!(t(0), "2026-12-04T10:00:00.000000Z");
        assert_eq!(t(999), "2026-12-04T10:00:00.000000Z");
        let offset = time::OffsetDateTime::from_unix_timestamp(1_796_378_400)
            .expect("a time")
            .to_offset(time::UtcOffset::from_hms(2, 0, 0).expect("an offset"));
        assert_eq!(lease_time(offset), "2026-12-04T10:00:00.000000Z");
    }
}
