//! Showing bytes that came from outside (payloads, handler answers, stderr)
//! in messages and logs without losing what made them unreadable.

use std::fmt::Write as _;

/// Characters of a table cell: `workerpool dead list` and `workers`, the
/// dashboard's lists. The whole value stays in the JSON.
pub const CELL_CHARS: usize = 200;

/// Characters of text from outside (a job's id or task, a handler's error)
/// in one line of a log or of output.
pub const LINE_CHARS: usize = 1_000;

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

/// `s` safe to print on a terminal, in a log line or in a table cell:
/// every character a terminal or a log reader would act on instead of
/// showing is written as its escape, never as itself, and the result is at
/// most `max_chars` characters long.
///
/// - Control characters (C0 with CR, LF and ESC, DEL, C1) become `\n`,
///   `\r`, `\t` or `\u{1b}`, so no escape sequence reaches a terminal
///   and no text can start a line of its own in a log.
/// - Bidi controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069)
///   and the line and paragraph separators (U+2028, U+2029) become
///   `\u{202e}`, so text cannot be shown in another order than it is.
/// - A longer result is cut between two characters (an escape is never
///   split) and ends with `…[N more chars]`, N counting the characters of
///   `s` left out. Below about 20 characters the note does not fit and the
///   result is `…`.
pub fn safe_line(s: &str, max_chars: usize) -> String {
    shown(units(s.as_bytes()), max_chars)
}

/// [`safe_line`] for bytes: what is not UTF-8 shows as `\xNN` (each such
/// byte counts as one character).
pub fn safe_bytes(bytes: &[u8], max_chars: usize) -> String {
    shown(units(bytes), max_chars)
}

/// Whether `c` changes the order text is shown in, or breaks a line,
/// without being a control character: the bidi controls and the line and
/// paragraph separators.
pub fn is_bidi_or_separator(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// One character of the input, or one byte that is not part of UTF-8.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Char(char),
    Byte(u8),
}

impl Unit {
    /// Characters it takes once shown.
    fn width(self) -> usize {
        match self {
            Unit::Char(c) if c.is_control() => c.escape_default().len(),
            Unit::Char(c) if is_bidi_or_separator(c) => c.escape_unicode().len(),
            Unit::Char(_) => 1,
            Unit::Byte(_) => 4,
        }
    }

    fn push(self, out: &mut String) {
        match self {
            Unit::Char(c) if c.is_control() => out.extend(c.escape_default()),
            Unit::Char(c) if is_bidi_or_separator(c) => out.extend(c.escape_unicode()),
            Unit::Char(c) => out.push(c),
            Unit::Byte(b) => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
}

fn units(bytes: &[u8]) -> impl Iterator<Item = Unit> + Clone + '_ {
    bytes.utf8_chunks().flat_map(|chunk| {
        chunk
            .valid()
            .chars()
            .map(Unit::Char)
            .chain(chunk.invalid().iter().map(|&b| Unit::Byte(b)))
    })
}

fn cut_note(left: usize) -> String {
    format!("…[{left} more chars]")
}

fn shown(units: impl Iterator<Item = Unit> + Clone, max_chars: usize) -> String {
    let mut out = String::new();
    let whole: usize = units.clone().map(Unit::width).sum();
    if whole <= max_chars {
        units.for_each(|u| u.push(&mut out));
        return out;
    }
    let count = units.clone().count();
    // The note's length with the most characters it could count.
    let Some(room) = max_chars.checked_sub(cut_note(count).chars().count()) else {
        return "…".chars().take(max_chars).collect();
    };
    let (mut used, mut taken) = (0, 0);
    for u in units {
        let width = u.width();
        if used + width > room {
            break;
        }
        u.push(&mut out);
        used += width;
        taken += 1;
    }
    out.push_str(&cut_note(count - taken));
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
    use proptest::prelude::*;

    /// What a terminal acts on: control characters, bidi controls and the
    /// line and paragraph separators.
    fn acts(c: char) -> bool {
        c.is_control() || is_bidi_or_separator(c)
    }

    #[test]
    fn escape_sequences_line_breaks_and_bidi_controls_are_shown_escaped() {
        assert_eq!(
            safe_line(
                "a\u{1b}]52;c;ZXZpbA==\u{7}b\u{1b}[2J\r\nFAKE level=INFO",
                100
            ),
            r"a\u{1b}]52;c;ZXZpbA==\u{7}b\u{1b}[2J\r\nFAKE level=INFO"
        );
        assert_eq!(
            safe_line(
                "x\u{202e}gnp\u{2066}\u{200f}\u{61c}\u{9b}\u{7f}\u{2028}",
                100
            ),
            r"x\u{202e}gnp\u{2066}\u{200f}\u{61c}\u{9b}\u{7f}\u{2028}"
        );
        assert_eq!(safe_line("héllo, 世界 ✓", 100), "héllo, 世界 ✓");
        assert_eq!(safe_bytes(b"ok \xff\n", 100), r"ok \xff\n");
    }

    #[test]
    fn a_long_text_is_cut_with_a_note_of_how_much_was_left_out() {
        let cut = safe_line(&"a".repeat(70_000), 200);
        assert_eq!(cut.chars().count(), 200);
        assert!(cut.starts_with("aaaa"), "{cut}");
        assert!(cut.ends_with("…[69819 more chars]"), "{cut}");
        // An escape is kept whole or left out whole.
        let cut = safe_line(&"\u{1b}".repeat(100), 40);
        assert_eq!(cut, r"\u{1b}\u{1b}\u{1b}…[97 more chars]");
        assert_eq!(safe_line("abc", 3), "abc");
        assert_eq!(safe_line("abcdef", 3), "…");
        assert_eq!(safe_line("abcdef", 0), "");
    }

    proptest! {
        #[test]
        fn nothing_a_terminal_acts_on_gets_through_and_the_bound_holds(
            chars in proptest::collection::vec(
                prop_oneof![
                    any::<char>(),
                    (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap_or('\0')),
                    (0x7fu32..0xa0).prop_map(|c| char::from_u32(c).unwrap_or('\0')),
                    proptest::sample::select(vec![
                        '\u{61c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}',
                        '\u{202d}', '\u{202e}', '\u{2066}', '\u{2067}', '\u{2068}',
                        '\u{2069}', '\u{2028}', '\u{2029}', '\\', 'a', 'é', '…',
                    ]),
                ],
                0..400,
            ),
            max in 0usize..500,
        ) {
            let s: String = chars.into_iter().collect();
            let shown = safe_line(&s, max);
            prop_assert!(!shown.chars().any(acts), "{:?} -> {:?}", s, shown);
            prop_assert!(shown.chars().count() <= max, "{} > {}", shown.chars().count(), max);
            if !s.chars().any(acts) && s.chars().count() <= max {
                prop_assert_eq!(&shown, &s);
            }
        }

        #[test]
        fn any_bytes_are_shown_safely_within_the_bound(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            max in 0usize..500,
        ) {
            let shown = safe_bytes(&bytes, max);
            prop_assert!(!shown.chars().any(acts), "{:?} -> {:?}", bytes, shown);
            prop_assert!(shown.chars().count() <= max);
        }
    }

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
