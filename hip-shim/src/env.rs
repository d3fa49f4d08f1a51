//! Environment variables, read the way NCCL reads its integer parameters.
//!
//! NCCL (`ncclLoadParam`) parses a set, non-empty value with `strtoll(value, &end, 0)`: an
//! optional sign, then decimal, `0x` hexadecimal or leading-`0` octal. A value with trailing
//! garbage is rejected with an INFO line and the default is used. [`Env::int_param`] does the
//! same and records *where* the value came from, so decisions can say why they were taken.
//!
//! The source is the caller's: `ibnet-ffi` passes its one reader of the process environment
//! (`Env::Lookup(ibnet_nccl::env::var)`, which reads only the variables declared in
//! `ibnet_core::config::gpu`), tests a fixed map. This crate never reads the process
//! environment itself; without a source ([`Env::default`]) every variable is unset.

use std::collections::BTreeMap;
use std::fmt;

/// Where environment variables are read from.
#[derive(Debug, Clone)]
pub enum Env {
    /// The caller's reader (the plugin's: `ibnet_nccl::env::var`).
    Lookup(fn(&str) -> Option<String>),
    /// A fixed set of variables; anything absent is unset. Used by tests.
    Fixed(BTreeMap<String, String>),
}

impl Default for Env {
    /// No variable set.
    fn default() -> Self {
        Self::Fixed(BTreeMap::new())
    }
}

/// Where an integer parameter's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamSource {
    /// The variable was unset or empty: the default applies.
    Default,
    /// The variable was set to a valid integer.
    Env,
    /// The variable was set to something that is not an integer (kept here); the default applies.
    Malformed(String),
}

/// An integer parameter as resolved from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntParam {
    /// Variable name, e.g. `NCCL_DMABUF_ENABLE`.
    pub name: &'static str,
    /// The value in effect.
    pub value: i64,
    /// Where `value` came from.
    pub source: ParamSource,
}

impl fmt::Display for IntParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            ParamSource::Default => write!(f, "{}={} (default)", self.name, self.value),
            ParamSource::Env => write!(f, "{}={}", self.name, self.value),
            ParamSource::Malformed(raw) => write!(
                f,
                "{}={} (default; ignored malformed value {raw:?})",
                self.name, self.value
            ),
        }
    }
}

impl Env {
    /// An environment holding exactly `vars`.
    pub fn fixed<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self::Fixed(
            vars.into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<String> {
        match self {
            Self::Lookup(f) => f(name),
            Self::Fixed(map) => map.get(name).cloned(),
        }
    }

    /// Resolves an integer parameter as NCCL does; see the module docs.
    pub fn int_param(&self, name: &'static str, default: i64) -> IntParam {
        let (value, source) = match self.get(name) {
            None => (default, ParamSource::Default),
            Some(raw) if raw.is_empty() => (default, ParamSource::Default),
            Some(raw) => match parse_c_integer(&raw) {
                Some(v) => (v, ParamSource::Env),
                None => (default, ParamSource::Malformed(raw)),
            },
        };
        IntParam {
            name,
            value,
            source,
        }
    }
}

/// Parses an integer like C's `strtoll(s, &end, 0)` with the requirement that the whole string
/// is consumed (`*end == '\0'`): leading whitespace, an optional sign, then `0x`/`0X`
/// hexadecimal, `0` octal or decimal. Out-of-range values are rejected (`None`), not clamped.
/// The number itself is read by [`ibnet_core::params::parse_int`], the one parser of NCCL-style
/// integers; this adds only `strtoll`'s skipping of leading whitespace.
pub fn parse_c_integer(s: &str) -> Option<i64> {
    ibnet_core::params::parse_int(s.trim_start()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_strtoll_base_zero() {
        assert_eq!(parse_c_integer("1"), Some(1));
        assert_eq!(parse_c_integer("0"), Some(0));
        assert_eq!(parse_c_integer("-1"), Some(-1));
        assert_eq!(parse_c_integer("+7"), Some(7));
        assert_eq!(parse_c_integer("  12"), Some(12));
        assert_eq!(parse_c_integer("0x1F"), Some(31));
        assert_eq!(parse_c_integer("0X10"), Some(16));
        assert_eq!(parse_c_integer("010"), Some(8));
        assert_eq!(parse_c_integer("-0x10"), Some(-16));
        assert_eq!(parse_c_integer("9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_c_integer("-9223372036854775808"), Some(i64::MIN));
    }

    #[test]
    fn rejects_what_strtoll_would_leave_unconsumed() {
        for bad in [
            "",
            " ",
            "abc",
            "1a",
            "1 ",
            "0x",
            "08",
            "--1",
            "1.0",
            "9223372036854775808",
            "+",
        ] {
            assert_eq!(parse_c_integer(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn int_param_records_its_source() {
        let env = Env::fixed([("A", "0"), ("B", "yes"), ("C", "")]);
        assert_eq!(env.int_param("A", 1).value, 0);
        assert_eq!(env.int_param("A", 1).source, ParamSource::Env);
        let b = env.int_param("B", 1);
        assert_eq!(
            (b.value, b.source.clone()),
            (1, ParamSource::Malformed("yes".into()))
        );
        assert!(b.to_string().contains("malformed"), "{b}");
        let c = env.int_param("C", 5);
        assert_eq!((c.value, c.source), (5, ParamSource::Default));
        let d = env.int_param("D", -1);
        assert_eq!(d.to_string(), "D=-1 (default)");
    }

    #[test]
    fn the_callers_reader_is_used_and_the_default_reads_nothing() {
        let env = Env::Lookup(|k| (k == "IBNET_GPU").then(|| "none".to_string()));
        assert_eq!(env.get("IBNET_GPU").as_deref(), Some("none"));
        assert_eq!(
            env.int_param("NCCL_DMABUF_ENABLE", 1).source,
            ParamSource::Default
        );
        assert_eq!(
            Env::default().get("PATH"),
            None,
            "never the process environment"
        );
    }
}
