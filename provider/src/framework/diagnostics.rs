//! Errors and warnings for the person running Terraform: a summary, a detail and, where
//! one input is to blame, the attribute path Terraform underlines.

use super::path::AttrPath;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    /// Shown, and the run goes on (e.g. an identity that could not be made yet).
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub summary: String,
    pub detail: String,
    pub path: Option<AttrPath>,
}

impl Diagnostic {
    pub fn error(summary: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            summary: summary.into(),
            detail: detail.into(),
            path: None,
        }
    }

    pub fn error_at(path: AttrPath, summary: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            path: Some(path),
            ..Self::error(summary, detail)
        }
    }

    /// A warning on `path`: shown, and the run goes on.
    pub fn warning_at(
        path: AttrPath,
        summary: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error_at(path, summary, detail)
        }
    }

    /// The same diagnostic, blamed on `path` unless it already names one.
    pub fn at(mut self, path: AttrPath) -> Self {
        if self.path.is_none() {
            self.path = Some(path);
        }
        self
    }
}

/// An ordered collection of diagnostics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.0.push(diagnostic);
    }

    /// An error on attribute `name`, summarised as `name: reason`.
    pub fn attr_error(&mut self, name: &str, reason: impl std::fmt::Display) {
        self.push(Diagnostic::error_at(
            AttrPath::attr(name),
            format!("{name}: {reason}"),
            "",
        ));
    }

    pub fn has_errors(&self) -> bool {
        self.0.iter().any(|d| d.severity == Severity::Error)
    }

    /// `Ok(())` when there is no error, the diagnostics otherwise.
    pub fn into_result(self) -> Result<(), Diagnostics> {
        if self.has_errors() {
            Err(self)
        } else {
            Ok(())
        }
    }
}

impl From<Diagnostic> for Diagnostics {
    fn from(diagnostic: Diagnostic) -> Self {
        Self(vec![diagnostic])
    }
}
