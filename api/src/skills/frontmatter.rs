//! The YAML frontmatter of a `SKILL.md` (`---` … `---` at its top): the
//! subset Skills use, top-level `key: value` pairs with plain, quoted or
//! block (`|`, `>`) scalars. Nested mappings and lists are skipped: only
//! `name` and `description` are read.

use std::collections::BTreeMap;

/// The top-level scalar keys of `text`'s frontmatter; `Err` when there is none
/// or it never closes.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Err(
            "SKILL.md must start with YAML frontmatter: a line \"---\", `name:` and `description:`, and a closing \"---\""
                .into(),
        );
    }
    let mut body = Vec::new();
    let mut closed = false;
    for line in lines {
        let t = line.trim_end();
        if t == "---" || t == "..." {
            closed = true;
            break;
        }
        body.push(line);
    }
    if !closed {
        return Err("SKILL.md's frontmatter has no closing \"---\" line".into());
    }
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < body.len() {
        let line = body[i];
        i += 1;
        if line.trim().is_empty()
            || line.trim_start().starts_with('#')
            || line.starts_with([' ', '\t'])
        {
            continue;
        }
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let key = key.trim().to_string();
        let rest = rest.trim();
        // Continuation lines: more indented than the key (which is at column 0).
        let mut block = Vec::new();
        while i < body.len() && (body[i].starts_with([' ', '\t']) || body[i].trim().is_empty()) {
            block.push(body[i]);
            i += 1;
        }
        let value = if let Some(style) = rest.strip_prefix(['|', '>']).map(|_| rest.as_bytes()[0]) {
            block_scalar(&block, style == b'|', rest.ends_with('-'))
        } else if rest.is_empty() {
            // A nested mapping or list (or an empty value): not a scalar we read.
            continue;
        } else {
            let mut value = unquote(rest);
            // A plain scalar may continue on indented lines, folded with spaces.
            if !rest.starts_with(['"', '\'']) {
                for more in block.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
                    value.push(' ');
                    value.push_str(more);
                }
            }
            value
        };
        out.insert(key, value);
    }
    Ok(out)
}

fn unquote(raw: &str) -> String {
    if let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(other) => out.push(other),
                    None => {}
                }
            } else {
                out.push(c);
            }
        }
        return out;
    }
    if let Some(inner) = raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return inner.replace("''", "'");
    }
    // A comment after a plain scalar.
    match raw.find(" #") {
        Some(at) => raw[..at].trim_end().to_string(),
        None => raw.to_string(),
    }
}

fn block_scalar(lines: &[&str], literal: bool, strip: bool) -> String {
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let lines: Vec<&str> = lines
        .iter()
        .map(|l| if l.len() >= indent { &l[indent..] } else { "" })
        .collect();
    let mut out = if literal {
        lines.join("\n")
    } else {
        let mut folded = String::new();
        for (n, l) in lines.iter().enumerate() {
            if l.is_empty() {
                folded.push('\n');
            } else {
                if n > 0 && !folded.ends_with('\n') {
                    folded.push(' ');
                }
                folded.push_str(l);
            }
        }
        folded
    };
    let trimmed = out.trim_end_matches('\n').len();
    out.truncate(trimmed);
    if !strip && literal {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_quoted_and_block_values() {
        let got = parse(
            "---\nname: pdf-tools\ndescription: \"Fill \\\"forms\\\"\" \n# note\nlicense: 'it''s MIT'\nmetadata:\n  version: 2\n---\n# Body\n",
        )
        .unwrap();
        assert_eq!(got["name"], "pdf-tools");
        assert_eq!(got["description"], "Fill \"forms\"");
        assert_eq!(got["license"], "it's MIT");
        assert!(!got.contains_key("metadata") && !got.contains_key("version"));

        let got =
            parse("---\ndescription: >\n  Folded\n  text.\n\n  Next.\nname: x # c\n---\n").unwrap();
        assert_eq!(got["description"], "Folded text.\nNext.");
        assert_eq!(got["name"], "x");
        let got = parse("---\ndescription: |-\n  line 1\n  line 2\n---\n").unwrap();
        assert_eq!(got["description"], "line 1\nline 2");
        let got = parse("---\ndescription: one\n  two\n---").unwrap();
        assert_eq!(got["description"], "one two");
    }

    #[test]
    fn frontmatter_must_open_and_close() {
        assert!(parse("# no frontmatter\n")
            .unwrap_err()
            .contains("must start"));
        assert!(parse("---\nname: x\n").unwrap_err().contains("closing"));
        assert!(parse("\u{feff}---\nname: x\n---\n").is_ok());
    }
}
