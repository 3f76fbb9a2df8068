//! Integers as text without the `fmt` machinery, for the lines and events written per
//! request: `write!` of one integer costs ~1,000 instructions, these a few dozen.

/// Appends `n` in decimal.
pub fn push_decimal(out: &mut String, n: u64) {
    let (digits, at) = decimal(n);
    out.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
}

/// Appends `n` in decimal to bytes.
pub fn push_decimal_bytes(out: &mut Vec<u8>, n: u64) {
    let (digits, at) = decimal(n);
    out.extend_from_slice(&digits[at..]);
}

/// `n`'s decimal digits, in `digits[at..]`.
fn decimal(mut n: u64) -> ([u8; 20], usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    (digits, at)
}

/// Appends `n` in lowercase hexadecimal, without leading zeros.
pub fn push_hex(out: &mut Vec<u8>, n: u64) {
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1);
    for shift in (0..digits).rev() {
        out.push(b"0123456789abcdef"[(n >> (shift * 4)) as usize & 0xf]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_match_the_formatter() {
        let mut values = vec![0, 1, 9, 10, 15, 16, 99, 100, 255, 4_294_967_296, u64::MAX];
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((1..20).map(|e| 10u64.pow(e) - 1));
        for n in values {
            let mut decimal = String::from("x");
            push_decimal(&mut decimal, n);
            assert_eq!(decimal, format!("x{n}"));
            let mut bytes = b"x".to_vec();
            push_decimal_bytes(&mut bytes, n);
            assert_eq!(bytes, format!("x{n}").into_bytes());
            let mut hex = b"x".to_vec();
            push_hex(&mut hex, n);
            assert_eq!(String::from_utf8(hex).unwrap(), format!("x{n:x}"));
        }
    }
}
