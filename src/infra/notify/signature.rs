//! Signing webhook bodies, and checking a signature as a receiver does.
//!
//! With an `hmac_secret` configured, every request carries
//!
//! ```text
//! X-Parking-Lot-Signature: t=<unix ms>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
//! ```
//!
//! `t` is the time of that attempt (a retry is signed afresh), so a receiver can refuse old
//! requests, and the body is signed byte for byte as sent. [`verify`] is the receiver's
//! side: it recomputes the code over the raw body, compares in constant time, and checks
//! that `t` is recent.

use std::fmt;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The request header that carries the signature.
pub const SIGNATURE_HEADER: &str = "X-Parking-Lot-Signature";

type HmacSha256 = Hmac<Sha256>;

/// Signs bodies with one key. Holds the keyed state, never shows it.
#[derive(Clone)]
pub(crate) struct Signer {
    keyed: HmacSha256,
}

impl Signer {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            keyed: HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length"),
        }
    }

    /// The header value for `body` sent at `t_ms`.
    pub fn header(&self, t_ms: u64, body: &[u8]) -> String {
        let code = self.code(t_ms, body).finalize().into_bytes();
        format!("t={t_ms},v1={}", hex(&code))
    }

    fn code(&self, t_ms: u64, body: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(t_ms.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Signer(***)")
    }
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The header is not `t=<unix ms>,v1=<64 hex digits>`.
    #[error("malformed signature header; expected t=<unix ms>,v1=<64 hex digits>")]
    Malformed,
    /// The code does not match the body and timestamp: wrong secret, or altered in transit.
    #[error("signature does not match the body")]
    Mismatch,
    /// The timestamp is further from the receiver's clock than the tolerance allows.
    #[error("signature timestamp {t_ms} is {off_by_ms} ms away from now; the tolerance is {tolerance_ms} ms")]
    Stale {
        /// The signed timestamp, unix ms.
        t_ms: u64,
        /// How far it is from `now_ms`.
        off_by_ms: u64,
        /// The tolerance given.
        tolerance_ms: u64,
    },
}

/// The `X-Parking-Lot-Signature` value for `body` sent at `t_ms` (unix ms): what the notifier
/// sends, for receivers that want to test their endpoint.
pub fn sign(secret: &[u8], t_ms: u64, body: &[u8]) -> String {
    Signer::new(secret).header(t_ms, body)
}

/// Checks an `X-Parking-Lot-Signature` header against the raw request body, as a receiver
/// does: the code must match `HMAC-SHA256(secret, "<t>.<body>")` (compared in constant
/// time) and `t` must lie within `tolerance` of `now_ms`.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot::infra::notify::signature::{sign, verify, SignatureError};
///
/// let body = br#"{"task_id":7,"status":"completed"}"#;
/// let header = sign(b"whsec", 1_700_000_000_000, body);
/// let now = 1_700_000_000_500;
/// let five_minutes = Duration::from_secs(300);
/// assert_eq!(verify(b"whsec", &header, body, now, five_minutes), Ok(()));
/// assert_eq!(
///     verify(b"whsec", &header, br#"{"task_id":8}"#, now, five_minutes),
///     Err(SignatureError::Mismatch),
/// );
/// ```
pub fn verify(
    secret: &[u8],
    header: &str,
    body: &[u8],
    now_ms: u64,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let (t_ms, code) = parse(header).ok_or(SignatureError::Malformed)?;
    Signer::new(secret)
        .code(t_ms, body)
        .verify_slice(&code)
        .map_err(|_| SignatureError::Mismatch)?;
    let tolerance_ms = u64::try_from(tolerance.as_millis()).unwrap_or(u64::MAX);
    let off_by_ms = now_ms.abs_diff(t_ms);
    if off_by_ms > tolerance_ms {
        return Err(SignatureError::Stale {
            t_ms,
            off_by_ms,
            tolerance_ms,
        });
    }
    Ok(())
}

/// `t=<digits>,v1=<64 hex digits>` into the timestamp and the code's bytes.
fn parse(header: &str) -> Option<(u64, [u8; 32])> {
    let (t, v1) = header.trim().split_once(',')?;
    let t_ms = t.strip_prefix("t=")?;
    if t_ms.is_empty() || !t_ms.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let t_ms = t_ms.parse().ok()?;
    let digits = v1.strip_prefix("v1=")?.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let mut code = [0u8; 32];
    for (byte, pair) in code.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some((t_ms, code))
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_code_is_hmac_sha256_in_lower_case_hex() {
        // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_signed_body_verifies_and_anything_else_does_not() {
        let signer = Signer::new(b"whsec");
        let body = br#"{"task_id":7,"status":"completed"}"#;
        let header = signer.header(1_000, body);
        assert!(header.starts_with("t=1000,v1="));
        assert_eq!(header.len(), "t=1000,v1=".len() + 64);
        assert_eq!(verify(b"whsec", &header, body, 1_500, MINUTE), Ok(()));
        assert_eq!(
            verify(b"other", &header, body, 1_500, MINUTE),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"whsec", &header, br#"{"task_id":8}"#, 1_500, MINUTE),
            Err(SignatureError::Mismatch)
        );
        let replayed_later = header.replacen("t=1000", "t=2000", 1);
        assert_eq!(
            verify(b"whsec", &replayed_later, body, 2_000, MINUTE),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"whsec", &header, body, 1_000 + 61_000, MINUTE),
            Err(SignatureError::Stale {
                t_ms: 1_000,
                off_by_ms: 61_000,
                tolerance_ms: 60_000
            })
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        let good_code = "0".repeat(64);
        for header in [
            String::new(),
            format!("v1={good_code},t=1"),
            format!("t=,v1={good_code}"),
            format!("t=-1,v1={good_code}"),
            format!("t=1,v1={}", "0".repeat(63)),
            format!("t=1,v1={}g", "0".repeat(63)),
            format!("t=1;v1={good_code}"),
        ] {
            assert_eq!(
                verify(b"k", &header, b"", 1, MINUTE),
                Err(SignatureError::Malformed),
                "{header:?}"
            );
        }
    }

    #[test]
    fn the_signer_never_shows_its_key() {
        assert_eq!(format!("{:?}", Signer::new(b"hunter2")), "Signer(***)");
    }
}
