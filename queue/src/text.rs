//! Showing bytes that came from outside (payloads, handler answers, stderr)
//! in messages and logs without losing what made them unreadable.

/// `bytes` as text: valid UTF-8 as it is, every byte that is not part of
/// valid UTF-8 as `\xNN`, control characters escaped, cut after `max_chars`
/// characters with `…`.
pub fn escaped(bytes: &[u8], max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if chars == max_chars {
                out.push('…');
                return out;
            }
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
            chars += 1;
        }
        for b in chunk.invalid() {
            if chars == max_chars {
                out.push('…');
                return out;
            }
            out.push_str(&format!("\\x{b:02x}"));
            chars += 1;
        }
    }
    out
}

/// Why `bytes` is not UTF-8: the offset and value of the first bad byte.
pub fn utf8_problem(bytes: &[u8]) -> Option<String> {
    let e = std::str::from_utf8(bytes).err()?;
    let at = e.valid_up_to();
    Some(match bytes.get(at) {
        Some(b) if e.error_len().is_some() => format!("invalid byte 0x{b:02x} at offset {at}"),
        _ => format!("truncated character at offset {at}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_bytes_and_control_characters_are_escaped_and_text_is_kept() {
        assert_eq!(
            escaped(b"ok \xff\xfe\n\0end", 100),
            "ok \\xff\\xfe\\n\\u{0}end"
        );
        assert_eq!(escaped("héllo".as_bytes(), 100), "héllo");
    }

    #[test]
    fn long_input_is_cut_at_the_limit_in_characters() {
        assert_eq!(escaped(b"abcdef", 3), "abc…");
        assert_eq!(escaped(b"\xff\xff\xff\xff", 2), "\\xff\\xff…");
        assert_eq!(escaped(b"abc", 3), "abc");
    }

    #[test]
    fn the_first_bad_byte_is_named_with_its_offset() {
        assert_eq!(utf8_problem(b"fine"), None);
        assert_eq!(
            utf8_problem(b"ab\xffcd").as_deref(),
            Some("invalid byte 0xff at offset 2")
        );
        assert_eq!(
            utf8_problem(b"ab\xe2\x82").as_deref(),
            Some("truncated character at offset 2")
        );
    }
}
