//! HCL configurations built from blocks, so suites say what differs (a count, a model, a
//! window) instead of repeating whole resource blocks.
//!
//! ```
//! use gpufleet_e2e::hcl::{self, Block};
//! let main = hcl::config(&[
//!     hcl::tenant("t", "team"),
//!     hcl::quota("q", "gpufleet_tenant.t.id", "H100-80GB", 16),
//!     hcl::pool_cluster("c", "gpufleet_tenant.t.id", "train", "H100-80GB", 1)
//!         .depends_on(&["gpufleet_gpu_quota.q"]),
//! ]);
//! assert!(main.contains("resource \"gpufleet_tenant_cluster\" \"c\""));
//! ```

use std::fmt;

use crate::terraform::hcl_string;

/// One top-level block: `resource`, `data` or `output`, with attributes in the order given.
#[derive(Debug, Clone)]
pub struct Block {
    header: String,
    /// (name, HCL expression) pairs.
    attributes: Vec<(String, String)>,
}

impl Block {
    /// `resource "<kind>" "<label>" { ... }`
    pub fn resource(kind: &str, label: &str) -> Block {
        Block::with_header(format!("resource \"{kind}\" \"{label}\""))
    }

    /// `data "<kind>" "<label>" { ... }`
    pub fn data(kind: &str, label: &str) -> Block {
        Block::with_header(format!("data \"{kind}\" \"{label}\""))
    }

    /// `output "<name>" { value = <expression> }`
    pub fn output(name: &str, expression: &str) -> Block {
        Block::with_header(format!("output \"{name}\"")).expr("value", expression)
    }

    fn with_header(header: String) -> Block {
        Block {
            header,
            attributes: Vec::new(),
        }
    }

    /// Sets `name` to an HCL expression as written (a reference, a map, a list). Setting a
    /// name twice keeps the last value.
    pub fn expr(mut self, name: &str, expression: &str) -> Block {
        self.attributes.retain(|(n, _)| n != name);
        self.attributes
            .push((name.to_string(), expression.to_string()));
        self
    }

    /// Sets `name` to a string literal.
    pub fn string(self, name: &str, value: &str) -> Block {
        self.expr(name, &hcl_string(value))
    }

    pub fn number(self, name: &str, value: i64) -> Block {
        self.expr(name, &value.to_string())
    }

    pub fn boolean(self, name: &str, value: bool) -> Block {
        self.expr(name, &value.to_string())
    }

    /// `depends_on = [addresses...]`
    pub fn depends_on(self, addresses: &[&str]) -> Block {
        self.expr("depends_on", &format!("[{}]", addresses.join(", ")))
    }
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} {{", self.header)?;
        let width = self
            .attributes
            .iter()
            .map(|(n, _)| n.len())
            .max()
            .unwrap_or(0);
        for (name, expression) in &self.attributes {
            writeln!(f, "  {name:width$} = {expression}")?;
        }
        writeln!(f, "}}")
    }
}

/// The blocks as one file.
pub fn config(blocks: &[Block]) -> String {
    blocks
        .iter()
        .map(Block::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// `gpufleet_tenant.<label>` named `name`.
pub fn tenant(label: &str, name: &str) -> Block {
    Block::resource("gpufleet_tenant", label).string("name", name)
}

/// `gpufleet_gpu_quota.<label>`: `gpus` of `gpu_type` for the tenant `tenant` (an
/// expression: a reference such as `gpufleet_tenant.t.id`, or a quoted id).
pub fn quota(label: &str, tenant: &str, gpu_type: &str, gpus: i64) -> Block {
    Block::resource("gpufleet_gpu_quota", label)
        .expr("tenant", tenant)
        .string("gpu_type", gpu_type)
        .number("gpus", gpus)
}

/// `gpufleet_reservation.<label>` of `node_count` nodes over `[start, end)` (RFC 3339).
pub fn reservation(
    label: &str,
    tenant: &str,
    gpu_type: &str,
    node_count: i64,
    start: &str,
    end: &str,
) -> Block {
    Block::resource("gpufleet_reservation", label)
        .expr("tenant", tenant)
        .string("gpu_type", gpu_type)
        .number("node_count", node_count)
        .string("start_time", start)
        .string("end_time", end)
}

/// `gpufleet_tenant_cluster.<label>`: a Kubernetes cluster of `node_count` nodes from the
/// free pool (add `reservation_id` to draw from a reservation).
pub fn pool_cluster(
    label: &str,
    tenant: &str,
    name: &str,
    gpu_type: &str,
    node_count: i64,
) -> Block {
    Block::resource("gpufleet_tenant_cluster", label)
        .expr("tenant", tenant)
        .string("name", name)
        .string("orchestrator", "kubernetes")
        .string("gpu_type", gpu_type)
        .number("node_count", node_count)
}

/// A quoted id as a `tenant` expression, for configurations whose tenant was made elsewhere.
pub fn id(value: &str) -> String {
    hcl_string(value)
}
