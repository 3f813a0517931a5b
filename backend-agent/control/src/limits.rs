//! Wire bounds: every string, count, integer and time a request carries is checked against
//! the API's limits (`gpufleet_proto::limits`) before anything else reads it, so the rules,
//! the store and the messages never see a 1 MB name or an integer that overflows a sum.
//!
//! [`Bounded::check_bounds`] is implemented for each request message; the errors name the
//! field and quote at most a short prefix of a bad value.

use std::collections::HashMap;

use gpufleet_proto::limits::*;
use gpufleet_proto::v1;
use prost_types::Timestamp;

use crate::error::Error;

/// Characters of a value that a message quotes.
const QUOTED_CHARS: usize = 40;

/// Why a value is outside the API's bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Bound {
    #[error("{field}: must be at most {max} characters (got {len}): {prefix}")]
    TooLong {
        field: String,
        max: usize,
        len: usize,
        prefix: String,
    },
    #[error("{field}: must be at least {min} (got {value})")]
    TooSmall { field: String, min: i64, value: i64 },
    #[error("{field}: must be at most {max} (got {value})")]
    TooLarge { field: String, max: i64, value: i64 },
    #[error("{field}: at most {max} entries (got {count})")]
    TooMany {
        field: String,
        max: usize,
        count: usize,
    },
    #[error("{field}: {reason}")]
    BadTime { field: String, reason: String },
    #[error("{field}: {reason}")]
    BadNumber { field: String, reason: String },
    #[error("page_token: not a token this server issued; start again without one")]
    BadPageToken,
    /// An id longer than any id: it names nothing.
    #[error("{kind} {quoted} not found")]
    NoSuchId { kind: String, quoted: String },
}

impl From<Bound> for Error {
    fn from(b: Bound) -> Self {
        match b {
            Bound::NoSuchId { .. } => Error::NotFound(b.to_string()),
            _ => Error::Invalid(b.to_string()),
        }
    }
}

pub type Result<T = ()> = std::result::Result<T, Bound>;

/// A value for a message: in quotes, cut to its first characters (with "…") when long,
/// control characters escaped.
pub fn quote(value: &str) -> String {
    let mut out = String::from("'");
    for c in value.chars().take(QUOTED_CHARS) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if value.chars().nth(QUOTED_CHARS).is_some() {
        out.push('…');
    }
    out.push('\'');
    out
}

/// At most `max` characters.
pub fn text(field: &str, value: &str, max: usize) -> Result {
    // Bytes bound characters from above: only long values are counted.
    if value.len() <= max {
        return Ok(());
    }
    let len = value.chars().count();
    if len <= max {
        return Ok(());
    }
    Err(Bound::TooLong {
        field: field.into(),
        max,
        len,
        prefix: quote(value),
    })
}

/// An id (or a tenant's id or name) to look up: one longer than any id names nothing.
pub fn id(kind: &str, value: &str) -> Result {
    text("id", value, MAX_ID_CHARS).map_err(|_| Bound::NoSuchId {
        kind: kind.into(),
        quoted: quote(value),
    })
}

/// `min..=max`.
pub fn range(field: &str, value: i64, min: i64, max: i64) -> Result {
    if value < min {
        Err(Bound::TooSmall {
            field: field.into(),
            min,
            value,
        })
    } else if value > max {
        Err(Bound::TooLarge {
            field: field.into(),
            max,
            value,
        })
    } else {
        Ok(())
    }
}

/// A count where 0 means "unchanged" or "the default": 0, or `1..=max`.
pub fn optional(field: &str, value: i64, max: i64) -> Result {
    if value == 0 {
        Ok(())
    } else {
        range(field, value, 1, max)
    }
}

pub fn labels(labels: &HashMap<String, String>) -> Result {
    if labels.len() > MAX_LABELS {
        return Err(Bound::TooMany {
            field: "labels".into(),
            max: MAX_LABELS,
            count: labels.len(),
        });
    }
    for (key, value) in labels {
        text("labels (a key)", key, MAX_LABEL_KEY_CHARS)?;
        text(
            &format!("labels[{}]", quote(key)),
            value,
            MAX_LABEL_VALUE_CHARS,
        )?;
    }
    Ok(())
}

/// A time within 2000..=2200 with nanos in 0..=999,999,999 (absent is fine: the field is
/// optional or checked as required by the handler).
pub fn timestamp(field: &str, value: Option<&Timestamp>) -> Result {
    let Some(t) = value else { return Ok(()) };
    if !(0..=MAX_NANOS).contains(&t.nanos) {
        return Err(Bound::BadTime {
            field: field.into(),
            reason: format!("nanos must be 0..={MAX_NANOS} (got {})", t.nanos),
        });
    }
    if !(MIN_TIME_SECONDS..=MAX_TIME_SECONDS).contains(&t.seconds) {
        return Err(Bound::BadTime {
            field: field.into(),
            reason: format!(
                "must be between 2000-01-01T00:00:00Z and 2200-12-31T23:59:59Z (got {} seconds since 1970)",
                t.seconds
            ),
        });
    }
    Ok(())
}

/// A finite number in `0..=max` (NaN and infinities are refused).
pub fn real(field: &str, value: f64, max: f64) -> Result {
    if value.is_finite() && (0.0..=max).contains(&value) {
        return Ok(());
    }
    Err(Bound::BadNumber {
        field: field.into(),
        reason: format!("must be a number from 0 to {max} (got {value})"),
    })
}

/// A per-GPU MIG layout: at most 16 profiles, each `min_count..=64` instances.
pub fn mig_layout(field: &str, layout: &HashMap<String, i32>, min_count: i64) -> Result {
    if layout.len() > MAX_MIG_LAYOUT_ENTRIES {
        return Err(Bound::TooMany {
            field: field.into(),
            max: MAX_MIG_LAYOUT_ENTRIES,
            count: layout.len(),
        });
    }
    for (profile, count) in layout {
        text(&format!("{field} (a profile)"), profile, MAX_KEYWORD_CHARS)?;
        range(
            &format!("{field}[\"{profile}\"]"),
            (*count).into(),
            min_count,
            MAX_MIG_INSTANCES.into(),
        )?;
    }
    Ok(())
}

/// Where a list call resumes and how many items it answers at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub size: usize,
    /// The sort key of the last item of the previous page.
    pub after: Option<String>,
}

impl Page {
    pub fn parse(page_size: i32, page_token: &str) -> Result<Page> {
        range("page_size", page_size.into(), 0, MAX_PAGE_SIZE.into())?;
        text("page_token", page_token, MAX_PAGE_TOKEN_CHARS)?;
        let size = if page_size == 0 {
            DEFAULT_PAGE_SIZE
        } else {
            page_size
        };
        let after = if page_token.is_empty() {
            None
        } else {
            Some(decode_token(page_token).ok_or(Bound::BadPageToken)?)
        };
        Ok(Page {
            size: size as usize,
            after,
        })
    }
}

const TOKEN_PREFIX: &str = "p1.";

/// An opaque token for "after the item whose sort key is `key`".
pub fn encode_token(key: &str) -> String {
    format!("{TOKEN_PREFIX}{}", hex::encode(key.as_bytes()))
}

fn decode_token(token: &str) -> Option<String> {
    let bytes = hex::decode(token.strip_prefix(TOKEN_PREFIX)?).ok()?;
    String::from_utf8(bytes).ok()
}

/// The bounds of one request message.
pub trait Bounded {
    fn check_bounds(&self) -> Result;
}

/// A team's ssh public keys: how many, and how long each (their form is the login's check).
pub fn ssh_public_keys(keys: &[String]) -> Result {
    use gpufleet_slurm::login::{MAX_KEYS, MAX_KEY_BYTES};
    if keys.len() > MAX_KEYS {
        return Err(Bound::TooMany {
            field: "ssh_public_keys".into(),
            max: MAX_KEYS,
            count: keys.len(),
        });
    }
    for (i, key) in keys.iter().enumerate() {
        text(&format!("ssh_public_keys[{i}]"), key, MAX_KEY_BYTES)?;
    }
    Ok(())
}

fn request_id(value: &str) -> Result {
    text("request_id", value, MAX_REQUEST_ID_CHARS)
}

fn keyword(field: &str, value: &str) -> Result {
    text(field, value, MAX_KEYWORD_CHARS)
}

fn version(field: &str, value: &str) -> Result {
    text(field, value, MAX_VERSION_CHARS)
}

fn tenant(value: &str) -> Result {
    id("tenant", value)
}

fn gpus(field: &str, value: i64) -> Result {
    range(field, value, 0, MAX_GPUS)
}

/// A quota's `weight` (1 to 1000 when given) and `lending_limit_gpus` (0 to 1,000,000).
fn sharing(weight: Option<i64>, lending_limit_gpus: Option<i64>) -> Result {
    if let Some(w) = weight {
        range("weight", w, 1, MAX_QUOTA_WEIGHT)?;
    }
    match lending_limit_gpus {
        Some(l) => gpus("lending_limit_gpus", l),
        None => Ok(()),
    }
}

fn page(page_size: i32, page_token: &str) -> Result {
    Page::parse(page_size, page_token).map(|_| ())
}

impl Bounded for v1::CreateTokenRequest {
    fn check_bounds(&self) -> Result {
        request_id(&self.request_id)?;
        tenant(&self.tenant_id)?;
        text("name", &self.name, MAX_NAME_CHARS)?;
        keyword("scope", &self.scope)
    }
}

impl Bounded for v1::GetTokenRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        text("name", &self.name, MAX_NAME_CHARS)
    }
}

impl Bounded for v1::ListTokensRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::RotateTokenRequest {
    fn check_bounds(&self) -> Result {
        request_id(&self.request_id)?;
        tenant(&self.tenant_id)?;
        text("name", &self.name, MAX_NAME_CHARS)
    }
}

impl Bounded for v1::RevokeTokenRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        text("name", &self.name, MAX_NAME_CHARS)
    }
}

impl Bounded for v1::ListAuditEntriesRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::CreateTenantRequest {
    fn check_bounds(&self) -> Result {
        request_id(&self.request_id)?;
        text("name", &self.name, MAX_NAME_CHARS)?;
        text("display_name", &self.display_name, MAX_DISPLAY_NAME_CHARS)?;
        labels(&self.labels)
    }
}

impl Bounded for v1::GetTenantRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.id)
    }
}

impl Bounded for v1::ListTenantsRequest {
    fn check_bounds(&self) -> Result {
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::UpdateTenantRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.id)?;
        text("display_name", &self.display_name, MAX_DISPLAY_NAME_CHARS)?;
        labels(&self.labels)
    }
}

impl Bounded for v1::DeleteTenantRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.id)
    }
}

impl Bounded for v1::CreateGpuQuotaRequest {
    fn check_bounds(&self) -> Result {
        request_id(&self.request_id)?;
        tenant(&self.tenant_id)?;
        keyword("gpu_type", &self.gpu_type)?;
        gpus("gpus", self.gpus)?;
        gpus("burst_gpus", self.burst_gpus)?;
        sharing(self.weight, self.lending_limit_gpus)
    }
}

impl Bounded for v1::GetGpuQuotaRequest {
    fn check_bounds(&self) -> Result {
        id("gpu quota", &self.id)
    }
}

impl Bounded for v1::ListGpuQuotasRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::UpdateGpuQuotaRequest {
    fn check_bounds(&self) -> Result {
        id("gpu quota", &self.id)?;
        gpus("gpus", self.gpus)?;
        gpus("burst_gpus", self.burst_gpus)?;
        sharing(self.weight, self.lending_limit_gpus)
    }
}

impl Bounded for v1::DeleteGpuQuotaRequest {
    fn check_bounds(&self) -> Result {
        id("gpu quota", &self.id)
    }
}

impl Bounded for v1::QuotaUsageRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        keyword("gpu_type", &self.gpu_type)
    }
}

impl Bounded for v1::UsageRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        timestamp("since", self.since.as_ref())?;
        timestamp("until", self.until.as_ref())?;
        if self.by.len() > gpufleet_proto::limits::USAGE_GROUPS.len() {
            return Err(Bound::TooMany {
                field: "by".into(),
                max: gpufleet_proto::limits::USAGE_GROUPS.len(),
                count: self.by.len(),
            });
        }
        for (i, b) in self.by.iter().enumerate() {
            keyword(&format!("by[{i}]"), b)?;
        }
        Ok(())
    }
}

impl Bounded for v1::CreateReservationRequest {
    fn check_bounds(&self) -> Result {
        request_id(&self.request_id)?;
        tenant(&self.tenant_id)?;
        keyword("gpu_type", &self.gpu_type)?;
        range("node_count", self.node_count, 1, MAX_NODE_COUNT)?;
        timestamp("start_time", self.start_time.as_ref())?;
        timestamp("end_time", self.end_time.as_ref())?;
        if self.also_planned.len() > MAX_ALSO_PLANNED {
            return Err(Bound::TooMany {
                field: "also_planned".into(),
                max: MAX_ALSO_PLANNED,
                count: self.also_planned.len(),
            });
        }
        for (i, p) in self.also_planned.iter().enumerate() {
            let field = |name: &str| format!("also_planned[{i}].{name}");
            tenant(&p.tenant_id)?;
            keyword(&field("gpu_type"), &p.gpu_type)?;
            range(&field("node_count"), p.node_count, 1, MAX_NODE_COUNT)?;
            timestamp(&field("start_time"), p.start_time.as_ref())?;
            timestamp(&field("end_time"), p.end_time.as_ref())?;
        }
        Ok(())
    }
}

impl Bounded for v1::GetReservationRequest {
    fn check_bounds(&self) -> Result {
        id("reservation", &self.id)
    }
}

impl Bounded for v1::ListReservationsRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::UpdateReservationRequest {
    fn check_bounds(&self) -> Result {
        id("reservation", &self.id)?;
        optional("node_count", self.node_count, MAX_NODE_COUNT)?;
        timestamp("end_time", self.end_time.as_ref())
    }
}

impl Bounded for v1::DeleteReservationRequest {
    fn check_bounds(&self) -> Result {
        id("reservation", &self.id)
    }
}

impl Bounded for v1::CreateTenantClusterRequest {
    fn check_bounds(&self) -> Result {
        request_id(&self.request_id)?;
        tenant(&self.tenant_id)?;
        text("name", &self.name, MAX_NAME_CHARS)?;
        keyword("orchestrator", &self.orchestrator)?;
        keyword("gpu_type", &self.gpu_type)?;
        range("node_count", self.node_count, 1, MAX_NODE_COUNT)?;
        text("reservation_id", &self.reservation_id, MAX_ID_CHARS)?;
        optional("storage_gib", self.storage_gib, MAX_STORAGE_GIB)?;
        keyword("storage_retention", &self.storage_retention)?;
        mig_layout("mig_layout", &self.mig_layout, 1)?;
        version("cuda_version", &self.cuda_version)?;
        version("driver_version", &self.driver_version)?;
        keyword("acceptance_level", &self.acceptance_level)?;
        real(
            "acceptance.min_bus_bandwidth_gbps",
            self.min_bus_bandwidth_gbps,
            MAX_BANDWIDTH_GBPS,
        )?;
        ssh_public_keys(&self.ssh_public_keys)?;
        range("wait_seconds", self.wait_seconds, 0, MAX_WAIT_SECONDS)?;
        optional(
            "max_unavailable",
            self.max_unavailable.into(),
            MAX_UNAVAILABLE,
        )
    }
}

impl Bounded for v1::GetTenantClusterRequest {
    fn check_bounds(&self) -> Result {
        id("tenant cluster", &self.id)
    }
}

impl Bounded for v1::ListTenantClustersRequest {
    fn check_bounds(&self) -> Result {
        tenant(&self.tenant_id)?;
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::UpdateTenantClusterRequest {
    fn check_bounds(&self) -> Result {
        id("tenant cluster", &self.id)?;
        optional("node_count", self.node_count, MAX_NODE_COUNT)?;
        optional("storage_gib", self.storage_gib, MAX_STORAGE_GIB)?;
        keyword("storage_retention", &self.storage_retention)?;
        mig_layout("mig_layout", &self.mig_layout, 1)?;
        version("cuda_version", &self.cuda_version)?;
        version("driver_version", &self.driver_version)?;
        keyword("acceptance_level", &self.acceptance_level)?;
        real(
            "acceptance.min_bus_bandwidth_gbps",
            self.min_bus_bandwidth_gbps,
            MAX_BANDWIDTH_GBPS,
        )?;
        ssh_public_keys(&self.ssh_public_keys)?;
        optional(
            "max_unavailable",
            self.max_unavailable.into(),
            MAX_UNAVAILABLE,
        )
    }
}

impl Bounded for v1::DeleteTenantClusterRequest {
    fn check_bounds(&self) -> Result {
        id("tenant cluster", &self.id)
    }
}

impl Bounded for v1::ListNodesRequest {
    fn check_bounds(&self) -> Result {
        keyword("gpu_type", &self.gpu_type)?;
        text("cluster_id", &self.cluster_id, MAX_ID_CHARS)?;
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::ReturnNodeRequest {
    fn check_bounds(&self) -> Result {
        id("node", &self.name)
    }
}

impl Bounded for v1::DrainNodeRequest {
    fn check_bounds(&self) -> Result {
        id("node", &self.name)?;
        text("reason", &self.reason, MAX_DISPLAY_NAME_CHARS)
    }
}

impl Bounded for v1::ForgetNodeSecretRequest {
    fn check_bounds(&self) -> Result {
        id("node", &self.name)
    }
}

impl Bounded for v1::ListQuarantineBreakersRequest {
    fn check_bounds(&self) -> Result {
        Ok(())
    }
}

impl Bounded for v1::ResetQuarantineBreakerRequest {
    fn check_bounds(&self) -> Result {
        keyword("gpu_type", &self.gpu_type)
    }
}

impl Bounded for v1::ListDriverVersionsRequest {
    fn check_bounds(&self) -> Result {
        keyword("gpu_type", &self.gpu_type)?;
        version("cuda_version", &self.cuda_version)
    }
}

impl Bounded for v1::ResolveDriverRequest {
    fn check_bounds(&self) -> Result {
        keyword("gpu_type", &self.gpu_type)?;
        version("cuda_version", &self.cuda_version)?;
        version("driver_version", &self.driver_version)
    }
}

impl Bounded for v1::ListEventsRequest {
    fn check_bounds(&self) -> Result {
        id("object", &self.object_id)?;
        page(self.page_size, &self.page_token)
    }
}

impl Bounded for v1::ListGpuTypesRequest {
    fn check_bounds(&self) -> Result {
        Ok(())
    }
}

impl Bounded for v1::GetMetricsEndpointRequest {
    fn check_bounds(&self) -> Result {
        Ok(())
    }
}

impl Bounded for v1::AvailabilityRequest {
    fn check_bounds(&self) -> Result {
        keyword("gpu_type", &self.gpu_type)?;
        timestamp("start_time", self.start_time.as_ref())?;
        timestamp("end_time", self.end_time.as_ref())?;
        optional("node_count", self.node_count, MAX_NODE_COUNT)?;
        optional(
            "duration_seconds",
            self.duration_seconds,
            MAX_DURATION_SECONDS,
        )
    }
}

impl Bounded for v1::RunHealthCheckRequest {
    fn check_bounds(&self) -> Result {
        id("tenant cluster", &self.cluster_id)?;
        keyword("level", &self.level)?;
        range(
            "bandwidth_duration_ms",
            self.bandwidth_duration_ms.into(),
            0,
            MAX_BANDWIDTH_DURATION_MS.into(),
        )
    }
}

impl Bounded for v1::GetHealthReportRequest {
    fn check_bounds(&self) -> Result {
        id("tenant cluster", &self.cluster_id)
    }
}

impl Bounded for v1::CheckMigLayoutRequest {
    fn check_bounds(&self) -> Result {
        keyword("gpu_type", &self.gpu_type)?;
        mig_layout("layout", &self.layout, 0)
    }
}

/// Checks a request's bounds, as the domain error the API edge turns into a status.
pub fn check(request: &impl Bounded) -> std::result::Result<(), Error> {
    request.check_bounds().map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_quoted_by_a_short_prefix() {
        assert_eq!(quote("abc"), "'abc'");
        let long = "x".repeat(1 << 20);
        let q = quote(&long);
        assert_eq!(q, format!("'{}…'", "x".repeat(QUOTED_CHARS)));
        assert_eq!(quote("a\nb"), "'a\\nb'");
        // Cut on a character boundary.
        assert!(quote(&"é".repeat(100)).ends_with("é…'"));
        let err = text("display_name", &long, MAX_DISPLAY_NAME_CHARS).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("display_name: must be at most 256 characters (got 1048576): 'xxx"));
        assert!(msg.len() < 200, "{msg}");
    }

    #[test]
    fn text_counts_characters_not_bytes() {
        assert!(text("display_name", &"é".repeat(256), 256).is_ok());
        assert!(text("display_name", &"é".repeat(257), 256).is_err());
    }

    #[test]
    fn an_overlong_id_is_not_found_with_a_short_quote() {
        let err = id("tenant cluster", &"a".repeat(1 << 20)).unwrap_err();
        let e = Error::from(err.clone());
        assert!(matches!(e, Error::NotFound(_)));
        assert!(err.to_string().starts_with("tenant cluster 'aaaa"));
        assert!(err.to_string().ends_with("…' not found"));
        assert!(id("tenant", &"a".repeat(MAX_ID_CHARS)).is_ok());
    }

    #[test]
    fn a_dry_runs_planned_siblings_are_bounded_like_creates() {
        let sibling = v1::PlannedReservation {
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            ..Default::default()
        };
        let request = |siblings: Vec<v1::PlannedReservation>| v1::CreateReservationRequest {
            gpu_type: "H100-80GB".into(),
            node_count: 1,
            validate_only: true,
            also_planned: siblings,
            ..Default::default()
        };
        assert!(request(vec![sibling.clone(); MAX_ALSO_PLANNED])
            .check_bounds()
            .is_ok());
        assert_eq!(
            request(vec![sibling.clone(); MAX_ALSO_PLANNED + 1])
                .check_bounds()
                .unwrap_err()
                .to_string(),
            format!(
                "also_planned: at most {MAX_ALSO_PLANNED} entries (got {})",
                MAX_ALSO_PLANNED + 1
            )
        );
        let zero = v1::PlannedReservation {
            node_count: 0,
            ..sibling
        };
        assert_eq!(
            request(vec![zero]).check_bounds().unwrap_err().to_string(),
            "also_planned[0].node_count: must be at least 1 (got 0)"
        );
    }

    #[test]
    fn ranges_say_which_side() {
        assert_eq!(
            range("gpus", -1, 0, MAX_GPUS).unwrap_err().to_string(),
            "gpus: must be at least 0 (got -1)"
        );
        assert_eq!(
            range("gpus", i64::MAX, 0, MAX_GPUS)
                .unwrap_err()
                .to_string(),
            format!("gpus: must be at most {MAX_GPUS} (got {})", i64::MAX)
        );
        assert!(optional("storage_gib", 0, MAX_STORAGE_GIB).is_ok());
        assert_eq!(
            optional("node_count", -1, 10).unwrap_err().to_string(),
            "node_count: must be at least 1 (got -1)"
        );
    }

    #[test]
    fn labels_are_bounded_in_count_and_length() {
        let many: HashMap<String, String> =
            (0..10_000).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(
            labels(&many).unwrap_err().to_string(),
            "labels: at most 64 entries (got 10000)"
        );
        let big = HashMap::from([("team".to_string(), "v".repeat(1 << 20))]);
        assert!(labels(&big)
            .unwrap_err()
            .to_string()
            .starts_with("labels['team']: must be at most 256 characters"));
        let key = HashMap::from([("k".repeat(200), "v".to_string())]);
        assert!(labels(&key)
            .unwrap_err()
            .to_string()
            .starts_with("labels (a key): must be at most 128"));
    }

    #[test]
    fn times_are_within_two_centuries_and_nanos_in_range() {
        let t = |seconds, nanos| Timestamp { seconds, nanos };
        assert!(timestamp("end_time", None).is_ok());
        assert!(timestamp("end_time", Some(&t(MIN_TIME_SECONDS, 0))).is_ok());
        assert!(timestamp("end_time", Some(&t(MAX_TIME_SECONDS, MAX_NANOS))).is_ok());
        let far = timestamp("end_time", Some(&t(i64::MAX, 0))).unwrap_err();
        assert!(far
            .to_string()
            .starts_with("end_time: must be between 2000"));
        assert!(timestamp("end_time", Some(&t(MIN_TIME_SECONDS - 1, 0))).is_err());
        let nanos = timestamp("start_time", Some(&t(MIN_TIME_SECONDS, -1))).unwrap_err();
        assert_eq!(
            nanos.to_string(),
            "start_time: nanos must be 0..=999999999 (got -1)"
        );
        assert!(timestamp("start_time", Some(&t(MIN_TIME_SECONDS, 1_000_000_000))).is_err());
    }

    #[test]
    fn reals_are_finite_and_in_range() {
        assert!(real("min_bus_bandwidth_gbps", 0.0, MAX_BANDWIDTH_GBPS).is_ok());
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e300] {
            let err = real("min_bus_bandwidth_gbps", bad, MAX_BANDWIDTH_GBPS).unwrap_err();
            assert!(err
                .to_string()
                .starts_with("min_bus_bandwidth_gbps: must be a number"));
        }
    }

    #[test]
    fn mig_layouts() {
        let zero = HashMap::from([("1g.10gb".to_string(), 0)]);
        assert_eq!(
            mig_layout("mig_layout", &zero, 1).unwrap_err().to_string(),
            "mig_layout[\"1g.10gb\"]: must be at least 1 (got 0)"
        );
        assert!(mig_layout("layout", &zero, 0).is_ok());
        let huge = HashMap::from([("1g.10gb".to_string(), i32::MAX)]);
        assert!(mig_layout("layout", &huge, 0).is_err());
    }

    #[test]
    fn page_tokens_round_trip_and_foreign_ones_are_refused() {
        let p = Page::parse(0, "").unwrap();
        assert_eq!((p.size, p.after), (DEFAULT_PAGE_SIZE as usize, None));
        let token = encode_token("team-a\u{0}H100-80GB");
        assert_eq!(
            Page::parse(10, &token).unwrap().after.as_deref(),
            Some("team-a\u{0}H100-80GB")
        );
        assert_eq!(Page::parse(10, "garbage"), Err(Bound::BadPageToken));
        assert!(Page::parse(MAX_PAGE_SIZE + 1, "").is_err());
        assert!(Page::parse(-1, "").is_err());
    }

    #[test]
    fn requests_name_the_field() {
        let q = v1::CreateGpuQuotaRequest {
            request_id: "r".into(),
            tenant_id: "t".into(),
            gpu_type: "H100-80GB".into(),
            gpus: i64::MAX,
            burst_gpus: i64::MAX,
            ..Default::default()
        };
        assert!(q
            .check_bounds()
            .unwrap_err()
            .to_string()
            .starts_with("gpus:"));
        let r = v1::CreateTenantRequest {
            request_id: "r".repeat(1 << 20),
            ..Default::default()
        };
        assert!(r
            .check_bounds()
            .unwrap_err()
            .to_string()
            .starts_with("request_id: must be at most 128"));
        let c = v1::CreateTenantClusterRequest {
            request_id: "r".into(),
            name: "c".into(),
            node_count: 1,
            storage_gib: i64::MAX,
            ..Default::default()
        };
        assert!(c
            .check_bounds()
            .unwrap_err()
            .to_string()
            .starts_with("storage_gib: must be at most"));
    }

    #[test]
    fn a_quotas_weight_and_lending_limit_are_bounded_by_name() {
        let q = |weight: Option<i64>, lending_limit_gpus: Option<i64>| v1::UpdateGpuQuotaRequest {
            id: "q".into(),
            weight,
            lending_limit_gpus,
            ..Default::default()
        };
        assert!(q(None, None).check_bounds().is_ok());
        assert!(q(Some(1000), Some(MAX_GPUS)).check_bounds().is_ok());
        let refused = |r: v1::UpdateGpuQuotaRequest| r.check_bounds().unwrap_err().to_string();
        assert_eq!(
            refused(q(Some(0), None)),
            "weight: must be at least 1 (got 0)"
        );
        assert_eq!(
            refused(q(Some(1001), None)),
            "weight: must be at most 1000 (got 1001)"
        );
        assert_eq!(
            refused(q(None, Some(-1))),
            "lending_limit_gpus: must be at least 0 (got -1)"
        );
    }
}
