//! JSON bodies: a top-level array is several messages, anything else one.

use bytes::Bytes;

use super::json_scan;
use crate::error::{EngineError, Result};

/// Splits a JSON body into messages: a top-level array is flattened one level.
/// Messages are validated but not re-encoded: each is a zero-copy slice of the body
/// (without surrounding whitespace). `allow_empty`: `[]` is fine (creating a stream).
pub fn json_records(body: &Bytes, allow_empty: bool) -> Result<Vec<Bytes>> {
    use serde_json::value::RawValue;
    let invalid =
        |e: serde_json::Error| EngineError::bad_request(format!("body is not valid JSON: {e}"));
    let not_utf8 = || EngineError::bad_request("body is not valid JSON: not UTF-8");
    let empty = || EngineError::bad_request("empty JSON array: nothing to append");
    // The fast scanner answers for most bodies; what it is unsure of (and every
    // invalid body, for the error's wording) is serde_json's to decide. A body it
    // found all ASCII needs no UTF-8 check.
    if let Some((found, ascii)) = json_scan::scan(body) {
        if !ascii && std::str::from_utf8(body).is_err() {
            return Err(not_utf8());
        }
        return match found {
            json_scan::Messages::Array(spans) if spans.is_empty() && !allow_empty => Err(empty()),
            json_scan::Messages::Array(spans) => {
                Ok(spans.into_iter().map(|span| body.slice(span)).collect())
            }
            json_scan::Messages::One(span) => Ok(vec![body.slice(span)]),
        };
    }
    let text = std::str::from_utf8(body).map_err(|_| not_utf8())?;
    if text.trim_start().starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(text).map_err(invalid)?;
        if items.is_empty() && !allow_empty {
            return Err(empty());
        }
        Ok(items
            .iter()
            .map(|raw| body.slice_ref(raw.get().as_bytes()))
            .collect())
    } else {
        let raw: &RawValue = serde_json::from_str(text).map_err(invalid)?;
        Ok(vec![body.slice_ref(raw.get().as_bytes())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattens_one_level_without_copying() {
        let body = Bytes::from_static(br#" [ {"a": 1}, [2, 3], "x" ] "#);
        let records = json_records(&body, false).unwrap();
        assert_eq!(
            records,
            vec![
                Bytes::from_static(br#"{"a": 1}"#),
                Bytes::from_static(b"[2, 3]"),
                Bytes::from_static(br#""x""#)
            ]
        );
        assert_eq!(
            records[0].as_ptr(),
            body[3..].as_ptr(),
            "a slice of the body, not a copy"
        );
        assert_eq!(
            json_records(&Bytes::from_static(b"[[[1]]]"), false).unwrap(),
            vec![Bytes::from_static(b"[[1]]")]
        );
        assert_eq!(
            json_records(&Bytes::from_static(b"7"), false).unwrap(),
            vec![Bytes::from_static(b"7")]
        );
    }

    #[test]
    fn rejects_invalid_and_empty() {
        assert!(json_records(&Bytes::from_static(b"[]"), false).is_err());
        assert!(json_records(&Bytes::from_static(b"[]"), true)
            .unwrap()
            .is_empty());
        for bad in [&b"{"[..], b"[1,]", b"nope", b"[1] 2", b"\xff"] {
            assert!(
                json_records(&Bytes::copy_from_slice(bad), false).is_err(),
                "{bad:?}"
            );
        }
    }
}
