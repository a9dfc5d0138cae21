//! List commands and their pages: `projectid` on every list, every page of a listing, and the
//! page size CloudStack allows, learned from its refusal and shared by every clone of the
//! client. Apart from the request because paging is CloudStack's `BaseListCmd` contract, the
//! same for every list command, and its one learned limit must hold for all of them.

use crate::client::Client;
use crate::envelope::{Answer, malformed, raw_number};
use crate::{CsError, LOG_TARGET, types};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use std::sync::atomic::Ordering;

/// Upper bound on pages fetched for one list call, so a server that ignores `page` cannot keep
/// us looping.
const MAX_PAGES: u32 = 10_000;

/// Which list commands exist and what their arrays are called.
pub(crate) struct ListSpec {
    pub(crate) command: &'static str,
    /// Field holding the array inside the response object.
    pub(crate) field: &'static str,
}

impl Client {
    /// List params plus `projectid` when configured.
    pub(crate) fn list_params<'a>(
        &self,
        mut params: Vec<(&'a str, String)>,
    ) -> Vec<(&'a str, String)> {
        if let Some(project) = &self.inner.project_id {
            params.push(("projectid", project.clone()));
        }
        params
    }

    pub(crate) async fn list_one_page<T: DeserializeOwned>(
        &self,
        spec: &ListSpec,
        params: Vec<(&str, String)>,
    ) -> Result<Vec<T>, CsError> {
        let params = self.list_params(params);
        let (items, _) = self
            .call_with(spec.command, &params, |inner| parse_list(spec, inner))
            .await?;
        Ok(items)
    }

    /// Every page of a list command. Should CloudStack refuse the page size past the first
    /// page (its limit lowered by a restart), the listing starts again at the smaller size,
    /// since the pages already read were cut at the larger one.
    pub(crate) async fn list_all_pages<T: DeserializeOwned>(
        &self,
        spec: &ListSpec,
        params: Vec<(&str, String)>,
    ) -> Result<Vec<T>, CsError> {
        let base = self.list_params(params);
        let mut page_size = self.page_size();
        'listing: loop {
            let mut items = Vec::new();
            for page in 1..=MAX_PAGES {
                let (mut batch, count, used) =
                    self.list_page::<T>(spec, &base, page, page_size).await?;
                if used != page_size {
                    page_size = used;
                    if page > 1 {
                        continue 'listing;
                    }
                }
                let got = batch.len();
                items.append(&mut batch);
                let page_full = u32::try_from(got).is_ok_and(|g| g >= page_size);
                let count_reached =
                    count.is_some_and(|c| u64::try_from(items.len()).unwrap_or(u64::MAX) >= c);
                if !page_full || count_reached {
                    return Ok(items);
                }
            }
            return Err(malformed(
                spec.command,
                format!("paging did not end after {MAX_PAGES} pages"),
            ));
        }
    }

    /// One page of a list command (`base` already holds `projectid`): its items, `count`, and
    /// the page size used. `BaseListCmd.getPageSize` refuses a `pagesize` above
    /// `default.page.size` with 431 "Page size can't exceed max allowed page size value: N";
    /// then N is kept as this client's limit (every list call uses it from then on) and the
    /// same page is asked for again at once with N items.
    pub(crate) async fn list_page<T: DeserializeOwned>(
        &self,
        spec: &ListSpec,
        base: &[(&str, String)],
        page: u32,
        page_size: u32,
    ) -> Result<(Vec<T>, Option<u64>, u32), CsError> {
        let mut size = page_size;
        loop {
            let mut params = base.to_vec();
            params.push(("page", page.to_string()));
            params.push(("pagesize", size.to_string()));
            match self
                .call_with(spec.command, &params, |inner| parse_list::<T>(spec, inner))
                .await
            {
                Ok((items, count)) => return Ok((items, count, size)),
                // The size strictly falls with each retry, so this ends.
                Err(err) => match self.learn_page_limit(spec.command, &err) {
                    Some(limit) if limit < size => size = limit,
                    _ => return Err(err),
                },
            }
        }
    }

    /// The page-size limit a 431 refusal names, kept for the whole client (the smallest
    /// seen wins); `None` for any other error.
    fn learn_page_limit(&self, command: &str, err: &CsError) -> Option<u32> {
        let CsError::Api {
            errorcode: 431,
            errortext,
            ..
        } = err
        else {
            return None;
        };
        let limit = page_limit_in(errortext)?;
        let learned =
            self.inner
                .page_limit
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |known| {
                    (known == 0 || limit < known).then_some(limit)
                });
        if learned.is_ok() {
            tracing::info!(
                target: LOG_TARGET,
                command,
                limit,
                "CloudStack refuses larger pages (default.page.size); listing at most {limit} items a page from now on"
            );
        }
        Some(self.page_size().min(limit))
    }
}

/// The items and `count` of a list response; `{}` is an empty list. The items are read straight
/// from the raw JSON into `T`; only when that fails is the list walked item by item, to name
/// the item that is wrong.
pub(crate) fn parse_list<T: DeserializeOwned>(
    spec: &ListSpec,
    inner: &Answer<'_>,
) -> Result<(Vec<T>, Option<u64>), CsError> {
    let fields = &inner.fields;
    let count = fields
        .get("count")
        .and_then(|c| raw_number(c, |d| types::lenient::opt_u64(d)));
    let items = match fields.get(spec.field) {
        None => Vec::new(),
        Some(raw) if raw.get().trim() == "null" => Vec::new(),
        Some(raw) if raw.get().trim_start().starts_with('[') => {
            match serde_json::from_str::<Vec<T>>(raw.get()) {
                Ok(items) => items,
                Err(whole) => {
                    let raw_items: Vec<&RawValue> = serde_json::from_str(raw.get())
                        .map_err(|e| malformed(spec.command, format!("{}: {e}", spec.field)))?;
                    for (i, item) in raw_items.iter().enumerate() {
                        if let Err(e) = serde_json::from_str::<T>(item.get()) {
                            return Err(malformed(
                                spec.command,
                                format!("{}[{i}]: {e}", spec.field),
                            ));
                        }
                    }
                    return Err(malformed(spec.command, format!("{}: {whole}", spec.field)));
                }
            }
        }
        Some(_) => {
            return Err(malformed(
                spec.command,
                format!("\"{}\" is not an array", spec.field),
            ));
        }
    };
    Ok((items, count))
}

/// The page-size limit in CloudStack's refusal "Page size can't exceed max allowed page size
/// value: N" (`BaseListCmd.getPageSize`), when it is at least 1.
pub(crate) fn page_limit_in(errortext: &str) -> Option<u32> {
    const NEEDLE: &str = "max allowed page size value:";
    let lower = errortext.to_ascii_lowercase();
    let rest = lower[lower.find(NEEDLE)? + NEEDLE.len()..].trim_start();
    let digits: &str = &rest[..rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len())];
    let limit: u64 = digits.parse().ok()?;
    (limit >= 1).then(|| u32::try_from(limit).unwrap_or(u32::MAX))
}
