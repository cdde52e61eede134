//! Text as wide as a terminal shows it: the columns of `report` and `ls`, the progress
//! bar's name, and the caret under a recipe line. It owns widths and padding only, not
//! what is printed.
//!
//! A char is not a column: a CJK recipe name (`ベースライン`) takes two columns a
//! character, and a combining accent none, so padding by `chars().count()` left the
//! columns after such a name out of line.

use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// The columns `s` takes on a terminal.
pub fn width(s: &str) -> usize {
    s.width()
}

/// `s` then spaces, to `w` columns (`s` whole when it is wider).
pub fn pad_right(s: &str, w: usize) -> String {
    format!("{s}{}", " ".repeat(w.saturating_sub(width(s))))
}

/// Spaces then `s`, to `w` columns (`s` whole when it is wider).
pub fn pad_left(s: &str, w: usize) -> String {
    format!("{}{s}", " ".repeat(w.saturating_sub(width(s))))
}

/// The end of `s` that fits in `cols` columns, after a `…` when it was cut.
pub fn tail(s: &str, cols: usize) -> String {
    if width(s) <= cols {
        return s.to_string();
    }
    let mut kept = Vec::new();
    let mut used = 1; // the `…`
    for c in s.chars().rev() {
        let w = c.width().unwrap_or(0);
        if used + w > cols {
            break;
        }
        used += w;
        kept.push(c);
    }
    std::iter::once('…').chain(kept.into_iter().rev()).collect()
}

/// The start of `s` that fits in `cols` columns, then a `…` when it was cut.
pub fn head(s: &str, cols: usize) -> String {
    if width(s) <= cols {
        return s.to_string();
    }
    let mut kept = String::new();
    let mut used = 1; // the `…`
    for c in s.chars() {
        let w = c.width().unwrap_or(0);
        if used + w > cols {
            break;
        }
        used += w;
        kept.push(c);
    }
    kept + "…"
}

/// A char that acts on a terminal rather than shows: a control char, or a mark that
/// turns the direction of the text around it (U+202A-U+202E, U+2066-U+2069, and the
/// left-to-right, right-to-left and Arabic letter marks).
pub fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
        )
}

/// `s` safe to print on a terminal: control chars (but line breaks and tabs where `lines`)
/// and the bidirectional overrides shown escaped, as `\u{1b}`. Keys, paths and words from a
/// recipe reach error lines: an ESC there set the window title or cleared the screen, and a
/// U+202E turned the line's text around.
pub fn escaped(s: &str, lines: bool) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| unsafe_char(c) && !(lines && matches!(c, '\n' | '\t'));
    if !s.chars().any(bad) {
        return s.into();
    }
    s.chars()
        .flat_map(|c| match bad(c) {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect::<String>()
        .into()
}

/// A source line as shown under a finding, and the line of carets under its chars
/// `span`: a control char other than a tab, or a direction mark ([`unsafe_char`]), is
/// shown escaped (an ESC in a recipe line reached the terminal), a tab is kept in both lines so the terminal moves both alike,
/// and every other char takes its own width of spaces or carets.
pub fn underline(line: &str, span: std::ops::Range<usize>) -> (String, String) {
    let (mut shown, mut marks) = (String::new(), String::new());
    let mut carets = 0;
    for (i, c) in line.chars().enumerate() {
        let (text, w) = match c {
            '\t' => ("\t".to_string(), 0),
            c if unsafe_char(c) => {
                let e: String = c.escape_default().collect();
                let w = e.len();
                (e, w)
            }
            c => (c.to_string(), c.width().unwrap_or(0)),
        };
        shown.push_str(&text);
        if i < span.start {
            marks.push_str(if c == '\t' { "\t" } else { "" });
            marks.push_str(&" ".repeat(w));
        } else if i < span.end {
            // A tab inside the span is underlined by one caret; a zero-width char by none.
            let n = if c == '\t' { 1 } else { w };
            marks.push_str(&"^".repeat(n));
            carets += n;
        }
    }
    // A span past the end of the line (a missing value at its end) still gets its caret.
    if carets == 0 {
        marks.push_str(&"^".repeat(span.len().max(1)));
    }
    (shown, marks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_chars_take_two_columns() {
        assert_eq!(width("ベースライン"), 12);
        assert_eq!(width("cafe\u{301}"), 4);
        assert_eq!(pad_right("ベース", 8), "ベース  ");
        assert_eq!(pad_left("ab", 4), "  ab");
        assert_eq!(pad_left("abcdef", 4), "abcdef");
    }

    #[test]
    fn the_tail_fits_its_columns() {
        assert_eq!(tail("short", 10), "short");
        assert_eq!(tail("abcdefgh", 5), "…efgh");
        assert_eq!(tail("ベースライン", 6), "…イン");
        assert!(width(&tail("ベースライン", 6)) <= 6);
    }

    #[test]
    fn carets_stand_under_their_chars() {
        let (shown, marks) = underline("name = \"ベース\" x", 12..13);
        assert_eq!(shown, "name = \"ベース\" x");
        assert_eq!(marks, format!("{}^", " ".repeat(15)));
        let (_, marks) = underline("名前 = 1", 5..6);
        assert_eq!(marks, "       ^");
        // A tab before the span is kept, so the terminal moves both lines alike.
        let (shown, marks) = underline("\tkey = 1", 1..4);
        assert_eq!((shown.as_str(), marks.as_str()), ("\tkey = 1", "\t^^^"));
        // An ESC is shown escaped, and the carets after it move by the escape's width.
        let (shown, marks) = underline("a\u{1b}b", 2..3);
        assert_eq!((shown.as_str(), marks.as_str()), ("a\\u{1b}b", "       ^"));
        // A span at the end of the line.
        let (_, marks) = underline("key =", 5..6);
        assert_eq!(marks, "     ^");
    }
}
