//! The W3C Trace Context a job may carry: `traceparent` (and `tracestate`)
//! as a producer's tracing library writes them into an HTTP header, so the
//! worker's span for each attempt continues the producer's trace.

use std::fmt;

/// A parsed `traceparent`: `00-<trace id, 32 hex>-<parent id, 16 hex>-<flags, 2 hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (never all zeros).
    pub trace_id: [u8; 16],
    /// The id of the producer's span (never all zeros).
    pub parent_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value as the W3C Trace Context spec reads
    /// it: version `00` is exactly four dash-separated lowercase hex parts;
    /// a later version may append parts after the flags; version `ff`,
    /// all-zero ids and uppercase hex are invalid.
    pub fn parse(text: &str) -> Result<TraceParent, String> {
        let bad = |why: &str| {
            Err(format!(
                "traceparent {:?}: {why}",
                crate::text::safe_line(text, 80)
            ))
        };
        let parts: Vec<&str> = text.split('-').collect();
        let [version, trace_id, parent_id, flags, rest @ ..] = parts.as_slice() else {
            return bad("expected version-traceid-parentid-flags");
        };
        let hex = |part: &str, len: usize| {
            part.len() == len
                && part
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !hex(version, 2) || *version == "ff" {
            return bad("the version must be two lowercase hex digits other than ff");
        }
        if *version == "00" && !rest.is_empty() {
            return bad("version 00 has exactly four parts");
        }
        if !hex(trace_id, 32) || !hex(parent_id, 16) || !hex(flags, 2) {
            return bad(
                "the trace id must be 32 lowercase hex digits, the parent id 16, the flags 2",
            );
        }
        let mut out = TraceParent {
            trace_id: [0; 16],
            parent_id: [0; 8],
            flags: 0,
        };
        decode(trace_id, &mut out.trace_id);
        decode(parent_id, &mut out.parent_id);
        let mut f = [0u8; 1];
        decode(flags, &mut f);
        out.flags = f[0];
        if out.trace_id == [0; 16] || out.parent_id == [0; 8] {
            return bad("an all-zero trace id or parent id is invalid");
        }
        Ok(out)
    }

    /// Whether the producer sampled its trace.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

fn decode(hex: &str, into: &mut [u8]) {
    let digit = |b: u8| match b {
        b'0'..=b'9' => b - b'0',
        _ => b - b'a' + 10,
    };
    for (i, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
        into[i] = digit(pair[0]) << 4 | digit(pair[1]);
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.parent_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

/// The longest `tracestate` a job may carry (the W3C limit is 32 members;
/// 512 characters is what propagators must at least pass on).
pub const TRACESTATE_MAX: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_spec_examples_parse_and_print_back() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = TraceParent::parse(text).expect("valid");
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), text);
        assert_eq!(
            tp.parent_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        // A later version may carry more.
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes";
        assert!(!TraceParent::parse(future).expect("valid").sampled());
    }

    #[test]
    fn malformed_values_are_refused_with_a_reason() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let e = TraceParent::parse(bad).expect_err(bad);
            assert!(e.starts_with("traceparent"), "{e}");
        }
    }

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_panicking(text in ".{0,80}") {
            let _ = TraceParent::parse(&text);
        }

        #[test]
        fn every_valid_value_prints_back_as_it_was(
            trace in prop::array::uniform16(any::<u8>()),
            parent in prop::array::uniform8(any::<u8>()),
            flags in any::<u8>(),
        ) {
            prop_assume!(trace != [0; 16] && parent != [0; 8]);
            let tp = TraceParent { trace_id: trace, parent_id: parent, flags };
            prop_assert_eq!(TraceParent::parse(&tp.to_string()), Ok(tp));
        }
    }
}
