//! A variable's declaration: [`Var`] and the types it is made of ([`Kind`], [`Since`],
//! [`Reader`], [`Why`]), and typed parsing ([`Kind::parse`], [`Var::refusal`]).

use super::int::parse_int;

/// The NCCL (or RCCL) version a variable came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// First read by NCCL 2.`minor`.
    Nccl(u8),
    /// Already read by NCCL 2.`minor` (and the RCCL seed near it); its first version is older.
    NcclUpTo(u8),
    /// An RCCL variable (RCCL's `RCCL_*`, or RCCL's additions to `NCCL_IB_*`).
    Rccl,
    /// Read by NCCL 2.`from`..=2.`to`'s binary (no public source names the first one).
    NcclBinary(u8, u8),
    /// ibnet's own.
    Ibnet,
}

impl core::fmt::Display for Since {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Nccl(m) => write!(f, "NCCL 2.{m}"),
            Self::NcclUpTo(m) => write!(f, "NCCL ≤ 2.{m}"),
            Self::NcclBinary(a, b) => write!(f, "NCCL 2.{a}–2.{b}"),
            Self::Rccl => f.write_str("RCCL"),
            Self::Ibnet => f.write_str("ibnet"),
        }
    }
}

/// A variable's type and range: what [`Kind::parse`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An integer in NCCL's syntax ([`parse_int`]) within `min..=max`.
    Int {
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
    /// A boolean as NCCL reads one: any integer, non-zero meaning on.
    Flag,
    /// One of these words (exact, case-sensitive as NCCL compares).
    Word(&'static [&'static str]),
    /// Free text of at most this many bytes (lists, addresses, specs; the reader parses it).
    Text(usize),
    /// A file path (read as bytes; never parsed by the core).
    Path,
    /// A variable whose meaning ibnet does not know (no public NCCL source yet): any value.
    Opaque,
}

/// A variable's value as [`Kind::parse`] read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// [`Kind::Int`].
    Int(i64),
    /// [`Kind::Flag`].
    Flag(bool),
    /// [`Kind::Word`]: the word as accepted.
    Word(&'static str),
    /// [`Kind::Text`], [`Kind::Path`] and [`Kind::Opaque`]: the trimmed value.
    Text(&'a str),
}

impl<'a> Value<'a> {
    /// The integer of a [`Value::Int`] (a flag as 0/1).
    pub fn int(self) -> Option<i64> {
        match self {
            Self::Int(x) => Some(x),
            Self::Flag(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    /// The boolean of a [`Value::Flag`] (an integer: non-zero).
    pub fn flag(self) -> Option<bool> {
        self.int().map(|x| x != 0)
    }

    /// The text of a [`Value::Text`] or [`Value::Word`].
    pub fn text(self) -> Option<&'a str> {
        match self {
            Self::Text(t) => Some(t),
            Self::Word(w) => Some(w),
            _ => None,
        }
    }
}

impl Kind {
    /// Parses a value (trimmed of ASCII whitespace first). An empty value is an error: a
    /// caller treats an empty variable as unset, as NCCL does, before calling this.
    pub fn parse<'a>(&self, value: &'a str) -> Result<Value<'a>, &'static str> {
        let v = value.trim_matches(|c: char| c.is_ascii_whitespace());
        if v.is_empty() {
            return Err("empty value");
        }
        match *self {
            Self::Int { min, max } => {
                let x = parse_int(v)?;
                if x < min || x > max {
                    return Err("out of range");
                }
                Ok(Value::Int(x))
            }
            Self::Flag => Ok(Value::Flag(parse_int(v)? != 0)),
            Self::Word(words) => words
                .iter()
                .find(|w| **w == v)
                .map(|w| Value::Word(w))
                .ok_or("unrecognized value"),
            Self::Text(max) if v.len() > max => Err("too long"),
            Self::Text(_) | Self::Path | Self::Opaque => Ok(Value::Text(v)),
        }
    }
}

/// Why ibnet refuses a variable's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A Mellanox/NVIDIA `mlx5dv` feature: ibnet uses plain verbs.
    Mlx5Only,
    /// A GPU-initiated (GIN/GDAKI) feature: ibnet is a proxy-driven net plugin.
    GpuInitiated,
    /// Applies to a verbs plugin but ibnet does not implement it yet.
    NotImplemented,
    /// ibnet does it its own way; NCCL's alternative is not honoured.
    OwnScheme,
    /// NCCL 2.31+ reads it but its meaning is not public source: refused rather than guessed.
    NotPublic,
}

impl Why {
    /// The reason, as the WARN and README say it.
    pub fn text(self) -> &'static str {
        match self {
            Self::Mlx5Only => "an mlx5-only feature (mlx5dv); ibnet uses plain verbs",
            Self::GpuInitiated => "a GPU-initiated (GIN) feature; ibnet is a proxy-driven plugin",
            Self::NotImplemented => "not implemented yet in ibnet",
            Self::OwnScheme => "not honoured: ibnet keeps its own scheme",
            Self::NotPublic => "its meaning is not public NCCL source (2.31+); not guessed",
        }
    }
}

/// Who reads a variable and acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The plugin: `Params::set` parses it.
    Plugin,
    /// Refused: a value other than `keeps` (what ibnet already behaves like) is one WARN
    /// naming the variable and [`Why`]; `keeps` empty: every value is refused.
    Refused {
        /// Why ibnet does not honour it.
        why: Why,
        /// The values (as written, compared after parsing) ibnet already behaves like.
        keeps: &'static [&'static str],
    },
    /// The soft provider's config (`ibnet_soft::Config`).
    Soft,
    /// The GPU runtime (`ibnet-hip`'s `Env`).
    Gpu,
    /// ibnet-verbs' libibverbs loader (`verbs/src/loader.rs`).
    Loader,
    /// ibnet-nccl's logger (`nccl/src/log.rs`).
    Log,
    /// The tools (`ibnet-perf`, `ibnet-info`, `ibnet-soak`).
    Tools,
    /// NCCL itself; ibnet never reads it (listed for users).
    Nccl,
}

/// One environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// Its name.
    pub name: &'static str,
    /// Its type and range.
    pub kind: Kind,
    /// The default as a value of `kind` would be written (`Params::default` is built from
    /// it); empty when the default is "unset" or computed at run time.
    pub default: &'static str,
    /// The default as README shows it, when it says more than `default` (else empty).
    pub shown: &'static str,
    /// The version it came from.
    pub since: Since,
    /// Who reads it.
    pub reader: Reader,
    /// What it does in ibnet (README's last column).
    pub doc: &'static str,
}

impl Var {
    /// A variable the plugin reads (`Params::set`), with no [`Var::shown`] text.
    pub const fn new(
        name: &'static str,
        kind: Kind,
        default: &'static str,
        since: Since,
        doc: &'static str,
    ) -> Self {
        Self {
            name,
            kind,
            default,
            shown: "",
            since,
            reader: Reader::Plugin,
            doc,
        }
    }

    /// The same variable with README's default column saying `shown`.
    pub const fn shown(mut self, shown: &'static str) -> Self {
        self.shown = shown;
        self
    }

    /// The same variable, read by `reader`.
    pub const fn by(mut self, reader: Reader) -> Self {
        self.reader = reader;
        self
    }

    /// README's default column: [`Var::shown`], else [`Var::default`].
    pub fn shown_default(&self) -> &'static str {
        if self.shown.is_empty() {
            self.default
        } else {
            self.shown
        }
    }

    /// For a [`Reader::Refused`] variable set to `value`: `Ok(Some(why))` when ibnet won't
    /// honour the value, `Ok(None)` when ibnet already behaves like it (or the variable is
    /// not a refused one), `Err` when the value is malformed (the default stands).
    pub fn refusal(&self, value: &str) -> Result<Option<Why>, &'static str> {
        let Reader::Refused { why, keeps } = self.reader else {
            return Ok(None);
        };
        let got = self.kind.parse(value)?;
        let kept = keeps.iter().any(|k| self.kind.parse(k) == Ok(got));
        Ok((!kept).then_some(why))
    }
}
