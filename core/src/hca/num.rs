//! Numbers in an `NCCL_IB_HCA` entry: NCCL's reading (glibc `atoi`) and the well-formed
//! check ibnet adds.

/// What glibc's `atoi` returns for `s` on LP64: `(int) strtol(s, NULL, 10)`. Leading
/// `isspace` characters, an optional sign, then decimal digits up to the first other byte;
/// none: 0. `strtol` saturates at `LONG_MIN`/`LONG_MAX`, and the conversion to `int` keeps the
/// low 32 bits (so an overflowing number reads as -1 or 0, as NCCL's would).
pub fn atoi(s: &str) -> i32 {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let neg = match b.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let mut v: i64 = 0;
    let mut over = false;
    while let Some(d) = b.get(i).filter(|c| c.is_ascii_digit()) {
        let digit = i64::from(d - b'0');
        match v.checked_mul(10).and_then(|x| x.checked_add(digit)) {
            Some(x) => v = x,
            None => over = true,
        }
        i += 1;
    }
    let v = match (over, neg) {
        (true, false) => i64::MAX,
        (true, true) => i64::MIN,
        (false, true) => -v,
        (false, false) => v,
    };
    v as i32
}

/// A well-formed field: empty or `-1` (unset, `Some(-1)`), or decimal digits with a value in
/// `min..=max`. `None`: not well formed.
pub fn well_formed(s: &str, min: i32, max: i32) -> Option<i32> {
    if s.is_empty() || s == "-1" {
        return Some(-1);
    }
    if s.len() > 6 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i32 = s.parse().ok()?;
    (min..=max).contains(&v).then_some(v)
}
