//! Kubernetes' rules for label and taint text: label keys and values, the
//! cloud-controller-manager's sanitising of offering and zone names, and taints in the `kubectl
//! taint` form. Apart from the building because the operator's flags are checked with the same
//! rules before any template is built, and a label the API server would refuse must never reach
//! the autoscaler.

use super::{TaintEffect, TaintSpec, TemplateError};

/// Sanitises a string into a label value the way CloudStack's cloud-controller-manager does for
/// the instance-type and zone labels: every character outside `[A-Za-z0-9-_.]` becomes `_`,
/// then `-`, `_` and `.` are trimmed from both ends, then the result is cut to 63 characters and
/// trimmed again. (Older CCM releases instead deleted invalid characters, dots and dashes
/// included; the current behaviour is the one implemented.)
pub fn sanitize_label_value(s: &str) -> String {
    let is_trim = |c: char| matches!(c, '-' | '_' | '.');
    let mapped: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || is_trim(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(is_trim);
    if trimmed.len() > 63 {
        // Only ASCII remains, so byte 63 is a character boundary.
        trimmed[..63].trim_matches(is_trim).to_string()
    } else {
        trimmed.to_string()
    }
}

/// Parses a taint written as `key=value:Effect` or `key:Effect` (the `kubectl taint` form).
pub fn parse_taint(s: &str) -> Result<TaintSpec, TemplateError> {
    let err = |reason: String| TemplateError::InvalidTaint {
        input: s.to_string(),
        reason,
    };
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| err("missing ':Effect' (expected key=value:Effect or key:Effect)".into()))?;
    let effect = TaintEffect::parse(effect).ok_or_else(|| {
        err(format!(
            "unknown effect '{effect}'; expected NoSchedule, PreferNoSchedule or NoExecute"
        ))
    })?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, v),
        None => (kv, ""),
    };
    let taint = TaintSpec {
        key: key.to_string(),
        value: value.to_string(),
        effect,
    };
    validate_taint(&taint).map_err(err)?;
    Ok(taint)
}

/// Checks a label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of `[A-Za-z0-9-_.]` starting and ending with an alphanumeric.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!(
            "key prefix '{prefix}' must be a lower-case DNS subdomain of at most 253 characters"
        ));
    }
    if name.is_empty() {
        return Err("key name is empty".into());
    }
    if !is_label_token(name) {
        return Err(format!(
            "key name '{name}' must be at most 63 characters of [A-Za-z0-9-_.], starting and \
             ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Checks a label value: empty, or at most 63 characters of `[A-Za-z0-9-_.]` starting and
/// ending with an alphanumeric.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_token(value) {
        Ok(())
    } else {
        Err(format!(
            "value '{value}' must be empty or at most 63 characters of [A-Za-z0-9-_.], starting \
             and ending with a letter or digit"
        ))
    }
}

fn validate_taint(t: &TaintSpec) -> Result<(), String> {
    if t.key.is_empty() {
        return Err("key is empty".into());
    }
    validate_label_key(&t.key)?;
    validate_label_value(&t.value)
}

pub(super) fn validate_taints(taints: &[TaintSpec]) -> Result<(), TemplateError> {
    for (i, t) in taints.iter().enumerate() {
        let input = format!("{}={}:{}", t.key, t.value, t.effect.as_str());
        validate_taint(t).map_err(|reason| TemplateError::InvalidTaint {
            input: input.clone(),
            reason,
        })?;
        if taints[..i]
            .iter()
            .any(|o| o.key == t.key && o.effect == t.effect)
        {
            return Err(TemplateError::InvalidTaint {
                input,
                reason: "another taint has the same key and effect (Kubernetes rejects that)"
                    .into(),
            });
        }
    }
    Ok(())
}

fn is_label_token(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            let lower_alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty()
                && lower_alnum(&b[0])
                && lower_alnum(&b[b.len() - 1])
                && b.iter().all(|c| lower_alnum(c) || *c == b'-')
        })
}
