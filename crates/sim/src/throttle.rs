//! CloudStack's API throttling (the `rate-limit` plugin, `api.throttling.*`): the per-account
//! call counters and the answer a call over the limit gets. The settings live in
//! [`SimSettings`] (`throttling`, `throttling_max`, `throttling_interval`); this module owns
//! the counters, on the simulator's tokio clock so paused-time tests drive the windows.
//!
//! What CloudStack does, read from apache/cloudstack:
//! - Keys and defaults: `Config.ApiLimitEnabled` `api.throttling.enabled` = false,
//!   `ApiLimitInterval` `api.throttling.interval` = 1 (seconds), `ApiLimitMax`
//!   `api.throttling.max` = 25, `ApiLimitCacheSize` `api.throttling.cachesize` = 50000
//!   (`server/…/com/cloud/configuration/Config.java`). `ApiRateLimitServiceImpl.configure`
//!   reads them once, when the management server starts (a change needs a restart; here a
//!   `simConfigure` takes effect at once, for new windows).
//! - Per account: `ApiRateLimitServiceImpl.hasApiRateLimitBeenExceeded(accountId)` keeps one
//!   `StoreEntry` per account id in an Ehcache (`EhcacheLimitStore`), created by the first call
//!   with `StoreEntryImpl(timeToLive)`: expiry = now + interval, counter 0. Every call
//!   `incrementAndGet`s it, the refused ones too; a call is allowed while the count is at most
//!   `api.throttling.max`. The entry lives `timeToLive` seconds from its creation (the Ehcache
//!   element's time to live; `StoreEntryImpl.isExpired` is `now > expiry`), so a window is
//!   fixed, opened by the call that finds none, not sliding. Root admins are exempt
//!   (`checkAccess(Account, …)`: `isRootAdmin`; `KeyRole::Admin`, recorded: throttle_03).
//! - Where: the plugin is one of `ApiServer`'s `apiAccessCheckers`. `ApiServlet` calls
//!   `ApiServer.verifyRequest` before `handleRequest`; `verifyRequest` checks
//!   `signatureVersion`/`expires`, finds the key's user and account (both enabled), then
//!   `commandAvailable` → `checkCommandAvailable` runs every checker, and only then compares
//!   the signature. So a throttled call never reaches the command: a throttled
//!   `scaleKubernetesCluster` queued no job and is safe to send again. (An unknown key or an
//!   expired request is refused before it is counted; a bad signature is counted.)
//! - The answer: `commandAvailable` turns the plugin's `RequestLimitException` into
//!   `ServerApiException(ApiErrorCode.API_LIMIT_EXCEED, message)`; `ApiServlet` writes it with
//!   HTTP status `API_LIMIT_EXCEED.getHttpCode()` = 429, through
//!   `ApiServer.getSerializedApiError(ServerApiException, …)`: under `<command>response`
//!   (only UNSUPPORTED_ACTION_ERROR goes under `errorresponse`), `errorcode` 429, `cserrorcode`
//!   9999 (the two-argument `ServerApiException` constructor sets its own class's code,
//!   `CSExceptionErrorCode`: 9999), `errortext` from `throwExceptionDueToApiRateLimitReached`:
//!   "The given user has reached his/her account api limit, please retry after [N] ms.", N the
//!   window's remaining milliseconds (`StoreEntry.getExpireDuration`). Older releases write the
//!   number without brackets. `ApiServlet` also sets an `X-Description` header to the text, as
//!   the simulator does for every error (`http`).
//! - *Unverified*: the order of the checkers (the role checker first here, so a command the
//!   role forbids is a 432 whatever the count) and Ehcache's exact expiry instant. Not modelled:
//!   `api.throttling.cachesize` (Ehcache evicts an account's entry when full, restarting its
//!   count), `resetApiLimit`. `getApiLimit` reads a window ([`Limiter::window`],
//!   `accounts::api_limit`), its own call counted first (project_10: `apiIssued` 1), and is
//!   throttled like any call (throttle_02).

use std::collections::HashMap;
use std::time::Duration;

use super::config::SimSettings;
use super::reply::Reply;

/// The call counters, per account id.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    windows: HashMap<String, Window>,
    /// The commands answered 429, in order (for tests: [`crate::SimHandle::throttled`]).
    throttled: Vec<String>,
}

/// One account's window (`StoreEntryImpl`).
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Sim milliseconds after which the window is gone and the next call opens another.
    expires_ms: u64,
    /// Calls counted in it, refused ones included.
    counter: u64,
}

impl Limiter {
    /// Counts one call of `account` to `command` at `now_ms` as
    /// `ApiRateLimitServiceImpl.checkAccess` does. `Err(ms)`: over the limit, the window ends
    /// in `ms`. Nothing is counted while throttling is off (`isEnabled`).
    pub(crate) fn check(
        &mut self,
        account: &str,
        command: &str,
        settings: &SimSettings,
        now_ms: u64,
    ) -> Result<(), u64> {
        if !settings.throttling {
            return Ok(());
        }
        let interval = millis(settings.throttling_interval);
        let window = self.windows.entry(account.to_string()).or_insert(Window {
            expires_ms: now_ms.saturating_add(interval),
            counter: 0,
        });
        if now_ms > window.expires_ms {
            *window = Window {
                expires_ms: now_ms.saturating_add(interval),
                counter: 0,
            };
        }
        window.counter += 1;
        if window.counter <= u64::from(settings.throttling_max) {
            return Ok(());
        }
        let retry_after = window.expires_ms.saturating_sub(now_ms);
        self.throttled.push(command.to_string());
        Err(retry_after)
    }

    /// `account`'s window now, as `getApiLimit` reads it: the calls counted in it and the
    /// milliseconds left; `None` when it has none (never counted, or its window is over).
    pub(crate) fn window(
        &self,
        account: &str,
        settings: &SimSettings,
        now_ms: u64,
    ) -> Option<(u64, u64)> {
        if !settings.throttling {
            return None;
        }
        self.windows
            .get(account)
            .filter(|w| now_ms <= w.expires_ms)
            .map(|w| (w.counter, w.expires_ms - now_ms))
    }

    /// The commands answered 429 so far, in order.
    pub(crate) fn throttled(&self) -> Vec<String> {
        self.throttled.clone()
    }
}

/// CloudStack's answer to a call over the limit (see the module doc).
pub(crate) fn throttled_reply(response_name: &str, retry_after_ms: u64) -> Reply {
    Reply::error(
        response_name,
        429,
        9999,
        &format!(
            "The given user has reached his/her account api limit, please retry after [{retry_after_ms}] ms."
        ),
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(max: u32, interval_ms: u64) -> SimSettings {
        SimSettings {
            throttling: true,
            throttling_max: max,
            throttling_interval: Duration::from_millis(interval_ms),
            ..SimSettings::default()
        }
    }

    #[test]
    fn a_fixed_window_per_account_opened_by_its_first_call() {
        let s = on(2, 1000);
        let mut l = Limiter::default();
        assert_eq!(l.check("a", "x", &s, 100), Ok(()));
        assert_eq!(l.check("a", "x", &s, 600), Ok(()));
        // The third call in the window: refused until 100 + 1000.
        assert_eq!(l.check("a", "x", &s, 700), Err(400));
        // Refused calls count too, and the window does not move.
        assert_eq!(l.check("a", "x", &s, 1100), Err(0));
        // Another account has its own window.
        assert_eq!(l.check("b", "x", &s, 1100), Ok(()));
        // Past the expiry the next call opens a new window.
        assert_eq!(l.check("a", "x", &s, 1101), Ok(()));
        assert_eq!(l.throttled(), vec!["x", "x"]);
    }

    #[test]
    fn nothing_is_counted_while_off() {
        let mut s = on(1, 1000);
        s.throttling = false;
        let mut l = Limiter::default();
        for t in 0..10 {
            assert_eq!(l.check("a", "x", &s, t), Ok(()));
        }
        s.throttling = true;
        assert_eq!(l.check("a", "x", &s, 10), Ok(()));
        assert_eq!(l.check("a", "x", &s, 11), Err(999));
    }

    #[test]
    fn the_answer_is_cloudstacks_429() {
        let r = throttled_reply("scalekubernetesclusterresponse", 734);
        assert_eq!(r.status, 429);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let inner = &v["scalekubernetesclusterresponse"];
        assert_eq!(inner["errorcode"], 429);
        assert_eq!(inner["cserrorcode"], 9999);
        assert_eq!(
            inner["errortext"],
            "The given user has reached his/her account api limit, please retry after [734] ms."
        );
    }
}
