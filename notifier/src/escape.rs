//! How a value from outside (a job, workspace or node name, a finding's message) is written into
//! a chat message so that it stays text: the receiver renders it as the sender wrote it, with no
//! link, mention, heading or list of the value's making.
//!
//! Hand-written: the three rules are a few lines each, and the markdown crates render markdown;
//! none escapes text for the subset a chat robot renders.

/// The zero-width space that breaks an address's `://` or `www.`, so that no renderer's autolink
/// finds it (the text reads the same).
const BREAK: char = '\u{200b}';

/// One line of plain text: control characters (newlines among them) become spaces, and
/// addresses (`scheme://`, `www.`) are broken so that no client turns them into links.
pub fn plain(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.char_indices() {
        if c == '.' && i >= 3 && s.get(i - 3..i).is_some_and(|w| w.eq_ignore_ascii_case("www")) {
            out.push(BREAK);
        }
        out.push(if c.is_control() { ' ' } else { c });
        if c == ':' && s[i + 1..].starts_with("//") {
            out.push(BREAK);
        }
    }
    out
}

/// [`plain`], then every character markdown gives a meaning escaped with a backslash
/// (CommonMark: any ASCII punctuation may be), for DingTalk's markdown messages.
pub fn markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in plain(s).chars() {
        if matches!(
            c,
            '\\' | '`'
                | '*'
                | '_'
                | '['
                | ']'
                | '('
                | ')'
                | '{'
                | '}'
                | '#'
                | '+'
                | '-'
                | '.'
                | '!'
                | '|'
                | '<'
                | '>'
                | '~'
                | '"'
                | '&'
                | '@'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Slack's mrkdwn: `&`, `<` and `>` as entities (Slack's own rule; `<...>` is its link and
/// mention syntax), on [`plain`] text.
pub fn slack(s: &str) -> String {
    slack_entities(&plain(s))
}

/// Only Slack's three entities, for the operator's own text (the report's address).
pub fn slack_entities(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_in_a_name_stays_text() {
        assert_eq!(markdown("[x](http://evil.example)"), "\\[x\\]\\(http:\u{200b}//evil\\.example\\)");
        assert_eq!(markdown("**b** _i_ `c` # h"), "\\*\\*b\\*\\* \\_i\\_ \\`c\\` \\# h");
        assert_eq!(markdown("a\n### b\r\n- c"), "a \\#\\#\\# b  \\- c");
        assert_eq!(markdown("<https://e.x>"), "\\<https:\u{200b}//e\\.x\\>");
        assert_eq!(markdown("![i](x) | ~s~ + 1 \\"), "\\!\\[i\\]\\(x\\) \\| \\~s\\~ \\+ 1 \\\\");
        assert_eq!(markdown("node-7"), "node\\-7");
        assert_eq!(plain("see WWW.evil.example"), "see WWW\u{200b}.evil.example");
        assert_eq!(plain("ftp://h\tx"), "ftp:\u{200b}//h x");
        assert_eq!(slack("<!channel> & <http://e|x>"), "&lt;!channel&gt; &amp; &lt;http:\u{200b}//e|x&gt;");
        assert_eq!(plain("nodé-1 名前"), "nodé-1 名前", "non-ASCII is left alone");
    }
}
