//! README's variable table, rendered from [`super::TABLES`] (without allocation: a
//! [`core::fmt::Display`]). `core/tests/config_readme.rs` checks that README.md holds exactly
//! this text between its markers, so the two cannot drift.

use core::fmt::{Display, Formatter, Result};

use super::var::{Kind, Reader, Var};

/// The line before the table in README.md.
pub const BEGIN: &str = "<!-- variables: generated from core/src/config; edit there -->";
/// The line after the table in README.md.
pub const END: &str = "<!-- end of variables -->";

/// The whole table (header and one row per variable).
pub struct Table;

impl Display for Table {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        writeln!(
            f,
            "| variable | since | default | values | what ibnet does |"
        )?;
        writeln!(f, "| --- | --- | --- | --- | --- |")?;
        for v in super::all() {
            writeln!(f, "{}", Row(v))?;
        }
        Ok(())
    }
}

/// One row.
pub struct Row<'a>(pub &'a Var);

impl Display for Row<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        let v = self.0;
        let default = match v.shown_default() {
            "" => "(unset)",
            d => d,
        };
        write!(f, "| `{}` | {} | {} | ", v.name, v.since, default)?;
        Values(v.kind).fmt(f)?;
        write!(f, " | {}", v.doc)?;
        if let Reader::Refused { why, .. } = v.reader {
            write!(f, " ({})", why.text())?;
        }
        if v.reader == Reader::Nccl {
            f.write_str(" (read by NCCL, not by ibnet)")?;
        }
        f.write_str(" |")
    }
}

/// A [`Kind`] as README's "values" column says it.
pub struct Values(pub Kind);

impl Display for Values {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self.0 {
            Kind::Int { min, max } if min == i64::MIN && max == i64::MAX => f.write_str("integer"),
            Kind::Int { min, max } if max == i64::MAX => write!(f, "≥ {min}"),
            Kind::Int { min, max } => write!(f, "{min}..={max}"),
            Kind::Flag => f.write_str("0/1"),
            Kind::Word(words) => {
                for (i, w) in words.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" \\| ")?;
                    }
                    write!(f, "`{w}`")?;
                }
                Ok(())
            }
            Kind::Text(n) => write!(f, "text (≤ {n} B)"),
            Kind::Path => f.write_str("path"),
            Kind::Opaque => f.write_str("any"),
        }
    }
}
