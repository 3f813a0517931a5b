//! The API's bounds: the largest value, length and count each wire field may carry, and
//! the largest message either side sends. Part of the contract: the backend refuses what
//! is outside them (INVALID_ARGUMENT naming the field), the provider refuses the same at
//! plan time, and both sides' gRPC receive limits are [`MAX_MESSAGE_BYTES`].

/// The largest gRPC message either side sends or accepts (the gRPC default, 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Ids and tenant references (an id or a name). Longer ones name nothing.
pub const MAX_ID_CHARS: usize = 128;
/// A create's `request_id`.
pub const MAX_REQUEST_ID_CHARS: usize = 128;
/// Tenant and cluster names are DNS labels.
pub const MAX_NAME_CHARS: usize = 63;
pub const MAX_DISPLAY_NAME_CHARS: usize = 256;
/// Labels per tenant, and the length of each key and value.
pub const MAX_LABELS: usize = 64;
pub const MAX_LABEL_KEY_CHARS: usize = 128;
pub const MAX_LABEL_VALUE_CHARS: usize = 256;
/// GPU model names, orchestrators, MIG profile names, node names.
pub const MAX_KEYWORD_CHARS: usize = 64;
/// `cuda_version` and `driver_version`.
pub const MAX_VERSION_CHARS: usize = 32;
/// Bearer tokens (issued ones are 52 characters).
pub const MAX_TOKEN_CHARS: usize = 512;

/// A quota's `gpus`, and separately its `burst_gpus`.
pub const MAX_GPUS: i64 = 1_000_000;
/// A quota's `weight` in fair sharing of idle capacity (issue 42): 1 to this; 1 when unset.
pub const MAX_QUOTA_WEIGHT: i64 = 1_000;
/// A quota's `weight` when none is given.
pub const DEFAULT_QUOTA_WEIGHT: i64 = 1;
/// How long a cluster create may wait for capacity (`wait_seconds`, issue 42): a day.
pub const MAX_WAIT_SECONDS: i64 = 86_400;
/// A reservation's or a cluster's `node_count`.
pub const MAX_NODE_COUNT: i64 = 10_000;
/// Reservations a dry run places first (`also_planned`: the plan's siblings).
pub const MAX_ALSO_PLANNED: usize = 100;
/// How long GPU-seconds held are kept (issue 42): 400 days. Also the longest usage
/// window, and how far back one may start.
pub const USAGE_RETENTION_SECS: i64 = 400 * 86_400;
/// What a usage read may group by (`UsageRequest.by`, the data source's `by`).
pub const USAGE_GROUPS: [&str; 5] = ["tenant", "cluster", "gpu_type", "class", "mig_profile"];
/// The most rows one usage answer holds.
pub const MAX_USAGE_ROWS: usize = 10_000;

/// The rules of a usage window `[since, until)` that need no clock: "field: reason".
pub fn usage_window(since: i64, until: i64) -> Result<(), String> {
    if until <= since {
        return Err("until: must be after since".into());
    }
    if until - since > USAGE_RETENTION_SECS {
        return Err(format!(
            "until: the window may be at most {} days long (the usage retention); split it",
            USAGE_RETENTION_SECS / 86_400
        ));
    }
    Ok(())
}

/// The rule of a usage grouping: known names, each once ("by: reason").
pub fn usage_by(by: &[String]) -> Result<(), String> {
    for (i, b) in by.iter().enumerate() {
        if !USAGE_GROUPS.contains(&b.as_str()) {
            return Err(format!(
                "by: unknown grouping '{b}'; use any of {}",
                USAGE_GROUPS.join(", ")
            ));
        }
        if by[..i].contains(b) {
            return Err(format!("by: '{b}' appears twice"));
        }
    }
    Ok(())
}
/// A cluster's `storage_gib` (1 PiB).
pub const MAX_STORAGE_GIB: i64 = 1 << 20;
/// A cluster's `max_unavailable`.
pub const MAX_UNAVAILABLE: i64 = 1_000;
/// MIG layout entries per GPU (profiles), and instances of one profile (a cluster's at
/// least 1; no profile fits more than 7 on a GPU, the planner says why).
pub const MAX_MIG_LAYOUT_ENTRIES: usize = 16;
pub const MAX_MIG_INSTANCES: i32 = 64;

/// A cluster's `min_bus_bandwidth_gbps` (a finite number of Gbit/s): the one upper bound,
/// held by the wire bounds, the acceptance rule and the provider's plan alike. A fleet
/// bounds it lower per GPU model with `bus_bandwidth_gbps` in its fleet definition.
pub const MAX_BANDWIDTH_GBPS: f64 = 100_000.0;
/// A health check's `bandwidth_duration_ms` (one minute).
pub const MAX_BANDWIDTH_DURATION_MS: u32 = 60_000;

/// Timestamps: 2000-01-01T00:00:00Z ..= 2200-12-31T23:59:59Z; nanos 0..=999,999,999.
pub const MIN_TIME_SECONDS: i64 = 946_684_800;
pub const MAX_TIME_SECONDS: i64 = 7_289_654_399;
pub const MAX_NANOS: i32 = 999_999_999;
/// A duration asked about (availability's `duration_seconds`): ten years of 366 days.
pub const MAX_DURATION_SECONDS: i64 = 10 * 366 * 24 * 3600;

/// List calls: `page_size` 0 means [`DEFAULT_PAGE_SIZE`]; at most [`MAX_PAGE_SIZE`]. A page
/// may hold fewer items when they would not fit in one message.
pub const DEFAULT_PAGE_SIZE: i32 = 500;
pub const MAX_PAGE_SIZE: i32 = 1_000;
pub const MAX_PAGE_TOKEN_CHARS: usize = 1_024;

/// Nodes listed in a cluster's answer; the rest are counted in `nodes_omitted` and read
/// with ListNodes filtered by the cluster.
pub const MAX_CLUSTER_NODES_SHOWN: usize = 100;

/// A node's host as its agent declares it to Slurm (`RegisterNode`): its name, CPUs and
/// memory (MiB, 1 PiB).
pub const MAX_HOSTNAME_CHARS: usize = 64;
pub const MAX_NODE_CPUS: u32 = 65_536;
pub const MAX_NODE_MEMORY_MIB: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_window_is_forward_and_at_most_the_retention_long() {
        assert!(usage_window(0, 1).is_ok());
        assert!(usage_window(0, USAGE_RETENTION_SECS).is_ok());
        assert_eq!(
            usage_window(5, 5).unwrap_err(),
            "until: must be after since"
        );
        assert!(usage_window(0, USAGE_RETENTION_SECS + 1)
            .unwrap_err()
            .starts_with("until: the window may be at most 400 days long"));
    }

    #[test]
    fn a_usage_grouping_names_known_groups_once() {
        let by =
            |names: &[&str]| usage_by(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(by(&[]).is_ok());
        assert!(by(&["tenant", "cluster", "gpu_type", "class", "mig_profile"]).is_ok());
        assert_eq!(
            by(&["tenant", "model"]).unwrap_err(),
            "by: unknown grouping 'model'; use any of tenant, cluster, gpu_type, class, mig_profile"
        );
        assert_eq!(
            by(&["class", "class"]).unwrap_err(),
            "by: 'class' appears twice"
        );
    }
}
