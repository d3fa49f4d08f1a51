//! NCCL-style integers (`strtoll(value, .., 0)`), the one parser every reader shares.

/// Parses an integer the way NCCL's `strtoll(s, .., 0)` reads it (an optional sign, then
/// decimal, `0x`/`0X` hexadecimal or leading-`0` octal), but rejecting trailing junk and
/// overflow. `s` must already be trimmed. The one parser of NCCL-style integers: `Params`,
/// `ibnet-ffi`'s and `ibnet-soft`'s variables and `ibnet-hip`'s parameters all read through it.
pub fn parse_int(s: &str) -> core::result::Result<i64, &'static str> {
    let b = s.as_bytes();
    let (neg, b) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    let (radix, digits) = match b {
        [b'0', b'x' | b'X', rest @ ..] => (16, rest),
        [b'0', rest @ ..] if !rest.is_empty() => (8, rest),
        _ => (10, b),
    };
    if digits.is_empty() {
        return Err("not a number");
    }
    let mut mag: u64 = 0;
    for (i, &c) in digits.iter().enumerate() {
        let Some(d) = (c as char).to_digit(radix) else {
            return Err(if i == 0 && radix == 10 {
                "not a number"
            } else {
                "trailing characters after the number"
            });
        };
        mag = mag
            .checked_mul(u64::from(radix))
            .and_then(|m| m.checked_add(u64::from(d)))
            .ok_or("number does not fit in 64 bits")?;
    }
    if neg {
        if mag > i64::MIN.unsigned_abs() {
            return Err("number does not fit in 64 bits");
        }
        Ok((mag as i64).wrapping_neg())
    } else {
        i64::try_from(mag).map_err(|_| "number does not fit in 64 bits")
    }
}
