//! MIG layouts: the exact placement planner and its explanations.

mod geometry;
mod planner;
mod suggestions;

pub use geometry::{COMPUTE_SLICES, MEMORY_SLICES};
pub use planner::Placement;

use std::collections::BTreeMap;
use std::fmt;

use crate::catalog::GpuModel;

/// Profile name -> instance count, for one GPU.
pub type Layout = BTreeMap<String, u32>;

/// Why a layout does not fit one GPU, and the nearest layouts that do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutError {
    /// Which rule fails, in words.
    pub reason: String,
    /// Up to three distinct valid layouts closest to the request (may be empty).
    pub suggestions: Vec<Layout>,
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)?;
        if !self.suggestions.is_empty() {
            let rendered: Vec<String> = self.suggestions.iter().map(render_layout).collect();
            write!(f, "; nearest valid layouts: {}", rendered.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for LayoutError {}

/// Finds placements for `layout` on one GPU of `model`, in creation order (larger
/// profiles first, as the hardware needs), or says which rule fails and suggests the
/// nearest valid layouts.
pub fn plan(model: &GpuModel, layout: &Layout) -> Result<Vec<Placement>, LayoutError> {
    planner::place(model, layout).map_err(|refused| LayoutError {
        suggestions: refused
            .counts
            .map(|counts| suggestions::nearest(model, &counts))
            .unwrap_or_default(),
        reason: refused.reason,
    })
}

/// Renders a layout as HCL/TOML-like map: `{"1g.10gb" = 2, "3g.40gb" = 1}`.
pub fn render_layout(layout: &Layout) -> String {
    let items: Vec<String> = layout
        .iter()
        .map(|(name, count)| format!("\"{name}\" = {count}"))
        .collect();
    format!("{{{}}}", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_layout_is_sorted_and_quoted() {
        let mut l = Layout::new();
        l.insert("3g.40gb".into(), 1);
        l.insert("1g.10gb".into(), 2);
        assert_eq!(render_layout(&l), r#"{"1g.10gb" = 2, "3g.40gb" = 1}"#);
        assert_eq!(render_layout(&Layout::new()), "{}");
    }

    #[test]
    fn display_lists_suggestions() {
        let mut l = Layout::new();
        l.insert("7g.80gb".into(), 1);
        let e = LayoutError {
            reason: "memory slices: the layout needs 9 of 8".into(),
            suggestions: vec![l],
        };
        assert_eq!(
            e.to_string(),
            r#"memory slices: the layout needs 9 of 8; nearest valid layouts: {"7g.80gb" = 1}"#
        );
    }
}
